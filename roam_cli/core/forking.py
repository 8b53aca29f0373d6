"""A value made in a forked process while the caller goes on (`beside`): the plan without
recomputing beside the recomputing plan (pipeline), the offload candidates' bounds (offload.planner)."""

import multiprocessing as mp
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def beside(make, parallel: bool) -> Iterator:
    """A callable that returns make()'s value: made in a forked process while the caller goes on
    when `parallel` (and fork exists), else made at once. A process that fails or dies without
    an answer costs its time only: the value is then made in this one. The process does not
    outlive the block."""
    if not parallel or "fork" not in mp.get_all_start_methods():
        value = make()
        yield lambda: value
        return
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child():
        try:
            answer = ("value", make())
        except BaseException as e:  # answered, so that the parent does not wait for nothing
            answer = ("failed", repr(e))
        try:
            send.send(answer)
        except OSError:  # the parent has gone: nobody to tell
            pass

    process = ctx.Process(target=child, name="roam-beside")
    process.start()
    send.close()

    def value():
        try:
            kind, answer = receive.recv()
        except (EOFError, OSError):
            kind, answer = "failed", None
        process.join()
        return answer if kind == "value" else make()

    try:
        yield value
    finally:
        if process.is_alive():
            process.terminate()
        process.join()
        receive.close()
