"""What several task test files share: a small saved tokenizer, and a module run offline."""

from __future__ import annotations

import socket

import pytest


def _save_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from evalpipe.data import longctx

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(longctx.FILLER) * 5 + list(longctx.HEADER.values()), trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(str(path))


@pytest.fixture(scope="module")
def saved_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    _save_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def offline():
    """HF offline flags on, and every internet socket refused (and recorded)."""
    import datasets.config as dconfig
    import huggingface_hub.constants as hconst

    attempts: list = []
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def connect(self, address, *args, **kwargs):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            attempts.append(address)
            raise OSError(f"network disabled in this test ({address})")
        return real_connect(self, address, *args, **kwargs)

    def getaddrinfo(host, *args, **kwargs):
        if host not in ("localhost", "127.0.0.1", "::1", None):
            attempts.append(host)
            raise socket.gaierror(f"network disabled in this test ({host})")
        return real_getaddrinfo(host, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        mp.setattr(dconfig, "HF_HUB_OFFLINE", True)
        mp.setattr(hconst, "HF_HUB_OFFLINE", True)
        mp.setattr(socket.socket, "connect", connect)
        mp.setattr(socket, "getaddrinfo", getaddrinfo)
        yield attempts
    assert attempts == [], f"network access attempted: {attempts[:5]}"
