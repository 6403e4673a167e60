"""One rank of the distributed context-parallel tests (tests/test_context_parallel.py,
tests/test_context_parallel_backward.py).

    python tests/cp_worker.py RANK WORLD WORKDIR

Joins a gloo process group (rendezvous through a file in WORKDIR), reads WORKDIR/cases.pt,
calls every case's compiled module (imported from its file: the module needs only torch and
triton) with `cp_group` on this rank's inputs, and writes WORKDIR/out<RANK>.pt: per case the
returned tensors, or the ValueError's message. Kernels run in Triton's interpreter. A case's
"call" (default "chunk") says what runs: "chunk"; "chunk_backward" (its inputs hold do and
dht); "autograd": chunk on inputs that require grad, then backward of <o, do> + <final_state,
dht>, returning the gradients of the inputs in `grads` (absent: none), in that order.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def load(path: str):
    spec = importlib.util.spec_from_file_location(f"cp_layer_{abs(hash(path)):x}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.POISON_OUTPUTS = True  # every element a kernel fails to write stays NaN
    return module


def run_case(module, case: dict, rank: int) -> tuple:
    inputs, options, call = dict(case["inputs"][rank]), case["options"], case.get("call", "chunk")
    if call == "chunk":
        return tuple(module.chunk(**inputs, **options, cp_group=dist.group.WORLD))
    if call == "chunk_backward":
        return tuple(module.chunk_backward(**inputs, **options, cp_group=dist.group.WORLD))
    do, dht = inputs.pop("do"), inputs.pop("dht", None)
    grads = [name for name in case["grads"] if inputs.get(name) is not None]
    for name in grads:
        inputs[name] = inputs[name].clone().requires_grad_(True)
    o, final_state = module.chunk(**inputs, **options, cp_group=dist.group.WORLD)
    loss = (o * do).sum() + ((final_state * dht).sum() if dht is not None else 0)
    loss.backward()
    return tuple(inputs[name].grad for name in grads)


def main(rank: int, world: int, workdir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    cases = torch.load(os.path.join(workdir, "cases.pt"))
    modules, results = {}, []
    for case in cases:
        path = case["module"]
        if path not in modules:
            modules[path] = load(path)
        try:
            results.append(run_case(modules[path], case, rank))
        except ValueError as error:
            results.append(str(error))
    torch.save(results, os.path.join(workdir, f"out{rank}.pt"))
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
