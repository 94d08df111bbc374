# The seed module of the TVM forum thread "Use relax builtin_with_ctx operator in
# rewrite_call", for TVM 0.27 and the CPU: storage scope "global" (Hexagon's
# "global.vtcm" exists only on Hexagon).  Rewrite it with
#     rewrite-ext dma examples/copy_to_vtcm.py --run
# R.vm.copy_tensor is registered by rewrite_ext (no PyPI TVM has it).
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class Module:
    @R.function(pure=False)
    def main(x: R.Tensor((32, 64), dtype="int32")) -> R.Tensor((32, 64), dtype="int32"):
        vtcm_obj: R.Object = R.vm.alloc_storage(
            R.shape([16384]), R.prim_value(0), R.dtype("uint8"), R.str("global")
        )
        a: R.Tensor((32, 64), dtype="int32") = R.vm.alloc_tensor(
            vtcm_obj, R.prim_value(0), R.shape([32, 64]), R.dtype("int32")
        )
        R.vm.copy_tensor(x, a)
        b: R.Tensor((32, 64), dtype="int32") = R.vm.alloc_tensor(
            vtcm_obj, R.prim_value(8192), R.shape([32, 64]), R.dtype("int32")
        )
        R.vm.copy_tensor(a, b)
        out: R.Tensor((32, 64), dtype="int32") = R.builtin.alloc_tensor(
            R.shape([32, 64]), R.dtype("int32"), R.prim_value(0)
        )
        R.vm.copy_tensor(b, out)
        return out
