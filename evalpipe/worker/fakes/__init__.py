"""The fake engine (engine.py) and the fake vLLM server (server.py): evalpipe without vLLM,
answering in milliseconds, for the tests of everything around the engine (the runner,
resume, the watchdog, signals, serve mode's lifecycle, nightly) and for demos on a
machine without vLLM.

They ship in the product, as inspect_ai's ``mockllm`` model and lm-eval's ``dummy`` model
do, because what they test is the product's own orchestration, run from the installed
package (a worker imports its engine from the evalpipe it was started with, a served
variant starts ``python -m evalpipe.worker.fakes.server``). Shipping them does not make
them reachable by accident: the fake engine is one entry of the engine table
(worker/engine_choice.py), taken only when ``EVALPIPE_FAKE_ENGINE`` is set in the worker's
environment (never a config setting), the server refuses to start without it, and every
trace of either (the manifest's engine kind, the log, the path probes' model) says fake.
"""
