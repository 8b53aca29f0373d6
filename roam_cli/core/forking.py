"""Work in forked processes: a value made while the caller goes on (`beside`: the plan without
recomputing beside the recomputing plan, the offload candidates' bounds), and a map over tasks
(`parallel_map`: the tradeoff's points)."""

import multiprocessing as mp
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import connection as mp_connection


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


def parallel_map(work, tasks: list, workers: int) -> list:
    """[work(t) for t in tasks], in `workers` forked processes when more than one (and fork
    exists): each task's answer comes back through a pipe, in order. A process that fails or
    dies without an answer costs its time only: that task is then done here."""
    if workers <= 1 or len(tasks) <= 1 or "fork" not in mp.get_all_start_methods():
        return [work(t) for t in tasks]
    answers: list = [None] * len(tasks)
    done = [False] * len(tasks)
    queue = list(range(len(tasks)))
    ctx = mp.get_context("fork")
    running = []  # (task index, process, receiving end)

    def start(k: int) -> None:
        receive, send = ctx.Pipe(duplex=False)

        def child():
            try:
                send.send(("value", work(tasks[k])))
            except BaseException as e:  # answered, so that the parent does not wait for nothing
                try:
                    send.send(("failed", repr(e)))
                except OSError:
                    pass

        process = ctx.Process(target=child, name=f"roam-point-{k}")
        process.start()
        send.close()
        running.append((k, process, receive))

    try:
        while queue or running:
            while queue and len(running) < workers:
                start(queue.pop(0))
            ready = mp_connection.wait([r for _, _, r in running])
            for k, process, receive in [x for x in running if x[2] in ready]:
                try:
                    kind, answer = receive.recv()
                except (EOFError, OSError):
                    kind, answer = "failed", None
                if kind == "value":
                    answers[k], done[k] = answer, True
                process.join()
                receive.close()
                running.remove((k, process, receive))
    finally:
        for _, process, receive in running:
            process.terminate()
            process.join()
            receive.close()
    return [answers[k] if done[k] else work(tasks[k]) for k in range(len(tasks))]
