"""Storage dtypes. Every computation runs in float32; a dtype says how a buffer is stored and
how loads convert it. bfloat16 has no numpy type: it is accepted as `ml_dtypes.bfloat16`
arrays or as raw uint16 bit patterns."""
import numpy as np

from .errors import DTypeError

float32, float16, bfloat16 = "float32", "float16", "bfloat16"
int8, uint8, int32 = "int8", "uint8", "int32"

STORAGE = {float32: np.dtype(np.float32), float16: np.dtype(np.float16), bfloat16: np.dtype(np.uint16),
           int8: np.dtype(np.int8), uint8: np.dtype(np.uint8), int32: np.dtype(np.int32)}
_ALIASES = {"float": float32, "half": float16, "int": int32, "f32": float32, "f16": float16, "bf16": bfloat16}


def normalize(dtype) -> str:
    """A dtype name from a string, numpy dtype/type or torch dtype; DTypeError if unsupported."""
    name = str(getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or dtype)
    name = _ALIASES.get(name.removeprefix("torch."), name.removeprefix("torch."))
    if name not in STORAGE:
        raise DTypeError(f"unsupported dtype {dtype!r}; luminar stores {', '.join(STORAGE)}")
    return name


def to_storage(array, dtype: str, what: str) -> np.ndarray:
    """Check (and if lossless, convert) a user array for storage as `dtype`; `what` names it in errors."""
    if isinstance(array, np.generic):  # numpy scalars behave like 0-d arrays (uint16 = bf16 bits)
        array = np.asarray(array)
    if not isinstance(array, np.ndarray):
        if type(array).__module__.startswith("torch"):
            array = array.detach().cpu().numpy()
        else:
            try:
                array = np.asarray(array, dtype=np.float32 if dtype == bfloat16 else STORAGE[dtype])
            except (TypeError, ValueError) as e:
                raise DTypeError(f"{what}: cannot read {type(array).__name__} as {dtype}: {e}") from None
    if dtype == bfloat16:
        if array.dtype.name == "bfloat16" or array.dtype == np.uint16:
            return _c_order(array).view(np.uint16)
        if array.dtype == np.float32:  # round to nearest even bf16
            bits = _c_order(array).view(np.uint32).astype(np.uint64)
            return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    elif array.dtype == STORAGE[dtype] or (array.dtype.kind in "biuf" and np.can_cast(array.dtype, STORAGE[dtype], "safe")):
        return _c_order(array.astype(STORAGE[dtype], copy=False))
    raise DTypeError(f"{what}: expected dtype {dtype}, got {array.dtype} (convert it explicitly, e.g. .astype(np.{STORAGE[dtype]}))")


def _c_order(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array with the same shape (np.ascontiguousarray would turn 0-d into 1-d)."""
    return array if array.flags.c_contiguous else np.ascontiguousarray(array).reshape(array.shape)


def to_compute(buffer: np.ndarray, dtype: str) -> np.ndarray:
    """Load a stored buffer as float32, the compute type."""
    if dtype == bfloat16:
        return (buffer.astype(np.uint32) << 16).view(np.float32)
    return buffer.astype(np.float32, copy=False)
