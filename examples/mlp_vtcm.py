"""Stage an MLP's kernel inputs into VTCM, move them by DMA, and run it on the CPU.

    python examples/mlp_vtcm.py [--capacity BYTES | --target qcom/hexagon-v68] [--overlap [--num-queues N]] [--prefetch] [--print-ir]

The model is written with ``tvm.relax.frontend.nn`` and lowered by TVM's own
passes to VM-level IR (``rewrite_ext.hexagon.LowerToVMIR()``: kernels called
with their outputs passed last, memory planned into
``alloc_storage``/``alloc_tensor``, functions ``relax.force_pure``).  Then ``stage_in_vtcm`` copies each kernel
input into planned ``global.vtcm`` storage, ``copy_to_dma`` turns the copies
into Hexagon DMA transfers, and ``relax.build(target="llvm")`` builds it.
``relax.build``'s default pipeline runs the lowering passes again, which
change nothing on lowered IR, then frees dead tensors (KillAfterLastUse) and
lowers the VM builtins.  ``cpu_vtcm()`` and ``cpu_dma()`` stand in for the
VTCM allocator and the DMA engine; the output is compared with the original
model's.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from rewrite_ext.hexagon import (
    LowerToVMIR,
    copy_to_dma,
    cpu_dma,
    cpu_vtcm,
    format_overlap_report,
    overlap_report,
    plan_vtcm,
    stage_in_vtcm,
)

#: TVM's default build pipeline up to memory planning: the IR ``stage_in_vtcm`` works on.
LOWER_TO_VM_IR = LowerToVMIR()


class MLP(nn.Module):
    """Two linear layers with a ReLU between them."""

    def __init__(self, features: int = 64, hidden: int = 128, out: int = 32) -> None:
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, out)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.fc2(nn.relu(self.fc1(x)))


def export(batch: int = 8, features: int = 64) -> tuple[tvm.IRModule, list[np.ndarray]]:
    """The MLP as a Relax module (function ``forward``) and random inputs (x, then weights)."""
    mod, params = MLP(features).export_tvm(spec={"forward": {"x": nn.spec.Tensor((batch, features), "float32")}})
    rng = np.random.default_rng(0)
    shapes = [(batch, features)] + [tuple(int(d) for d in p.shape) for _, p in params]
    return mod, [rng.standard_normal(shape).astype("float32") for shape in shapes]


def run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> np.ndarray:
    """Build for llvm and run ``forward`` (inside the stand-ins when the module needs them)."""
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    return vm["forward"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--capacity", type=int, help="VTCM bytes (default: the target's)")
    where.add_argument("--target", default="qcom/hexagon-v68", help="Hexagon target whose vtcm-capacity is used")
    parser.add_argument("--overlap", action="store_true", help="copy_to_dma(overlap=True); prints the overlap report")
    parser.add_argument("--num-queues", type=int, default=1, help="DMA queues the transfers go round (default 1)")
    parser.add_argument("--prefetch", action="store_true", help="stage_in_vtcm(prefetch=True): double buffering")
    parser.add_argument("--print-ir", action="store_true", help="print the staged, DMA-rewritten IR")
    args = parser.parse_args(argv)
    capacity = args.capacity if args.capacity is not None else args.target

    model, inputs = export()
    expected = run(model, inputs)
    lowered = LOWER_TO_VM_IR(model)
    plan = plan_vtcm(lowered, capacity=capacity, prefetch=args.prefetch)
    print(plan)
    staged = stage_in_vtcm(lowered, capacity=capacity, prefetch=args.prefetch)
    staged = copy_to_dma(staged, overlap=args.overlap, num_queues=args.num_queues)
    if args.print_ir:
        print(staged["forward"])
    if args.overlap:
        print(format_overlap_report(overlap_report(staged)))
    with cpu_vtcm() as vtcm, cpu_dma() as dma:
        got = run(staged, inputs)
    equal = bool(np.array_equal(got, expected))
    print(f"# outputs equal: {equal}")
    print(f"# VTCM storages allocated: {vtcm.allocations} ({sum(vtcm.allocations)} bytes)")
    print(f"# DMA: {dma.summary()}")
    return 0 if equal and dma.copies == len(plan.staged) else 1


if __name__ == "__main__":
    sys.exit(main())
