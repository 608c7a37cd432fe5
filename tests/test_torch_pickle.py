"""luminar.io.torch_pickle: torch checkpoints read without torch, compared with torch.load; hostile pickles refused."""
import collections
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch

from luminar.errors import WeightFileError
from luminar.io.torch_pickle import load_torch_state_dict, read_torch_checkpoint
from luminar.models.mobilenet import default_weights_path

LAYOUTS = {"zip": True, "legacy": False}


def save(obj, path, layout):
    torch.save(obj, path, _use_new_zipfile_serialization=LAYOUTS[layout])
    return path


def sample_state():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return collections.OrderedDict([
        ("weight", torch.randn(3, 5)),
        ("transposed", base.t()),                       # non-contiguous strides
        ("sliced", base[1:3, 2:5]),                     # an offset into a shared storage
        ("same_storage", base),
        ("half", torch.randn(7).half()),
        ("bfloat16", torch.tensor([1.5, -2.25, 3e38, 1e-30]).bfloat16()),
        ("double", torch.randn(2, 2, dtype=torch.float64)),
        ("long", torch.tensor(1431430)),                # 0-d, like num_batches_tracked
        ("int", torch.arange(5, dtype=torch.int32)),
        ("bytes", torch.arange(4, dtype=torch.uint8)),
        ("flags", torch.tensor([True, False])),
        ("empty", torch.zeros(0, 3)),
        ("parameter", torch.nn.Parameter(torch.randn(2, 3))),
    ])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tensors_match_torch_load(tmp_path, layout):
    path = save(sample_state(), tmp_path / "state.pt", layout)
    ours = load_torch_state_dict(path)
    theirs = torch.load(path, weights_only=True)
    assert list(ours) == list(theirs)
    for name, tensor in theirs.items():
        expected = tensor.detach().float().numpy() if tensor.dtype == torch.bfloat16 else tensor.detach().numpy()
        assert ours[name].dtype == expected.dtype, name
        assert ours[name].shape == expected.shape, name
        np.testing.assert_array_equal(ours[name], expected, err_msg=name)
        assert ours[name].flags.c_contiguous and ours[name].flags.owndata or ours[name].base is not None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_containers_and_wrappers(tmp_path, layout):
    state = {"weight": torch.ones(2)}
    path = save({"state_dict": state, "epoch": 3, "names": ["a", "b"], "pair": (1, 2.5)}, tmp_path / "c.pt", layout)
    whole = read_torch_checkpoint(path)
    assert whole["epoch"] == 3 and whole["names"] == ["a", "b"] and whole["pair"] == (1, 2.5)
    np.testing.assert_array_equal(load_torch_state_dict(path)["weight"], [1.0, 1.0])  # unwrapped
    listed = save([torch.zeros(1)], tmp_path / "list.pt", layout)
    with pytest.raises(WeightFileError, match="expected a state dict"):
        load_torch_state_dict(listed)
    assert isinstance(read_torch_checkpoint(listed), list)


def test_real_mobilenet_checkpoint_matches_torch_load():
    path = default_weights_path()
    with open(path, "rb") as f:
        assert not zipfile.is_zipfile(f)  # the packaged checkpoint is the legacy layout
    ours, theirs = load_torch_state_dict(path), torch.load(path, weights_only=True)
    assert list(ours) == list(theirs) and len(ours) == 314
    for name, tensor in theirs.items():
        np.testing.assert_array_equal(ours[name], tensor.numpy(), err_msg=name)
        assert ours[name].dtype == tensor.numpy().dtype


class RunsCode:
    """Pickles as a call to os.system: what a hostile checkpoint does."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_code_in_a_checkpoint_is_refused_not_run(tmp_path, layout):
    marker = tmp_path / "ran"
    path = save({"weight": torch.ones(2), "evil": RunsCode(marker)}, tmp_path / "evil.pt", layout)
    with pytest.raises(WeightFileError, match=r"global (posix|os)\.system.*refusing"):
        read_torch_checkpoint(path)
    assert not marker.exists()


def test_a_plain_pickle_naming_eval_is_refused(tmp_path):
    marker = tmp_path / "ran"

    class Eval:
        def __reduce__(self):
            return eval, (f"open({str(marker)!r}, 'w')",)

    path = tmp_path / "raw.pkl"
    path.write_bytes(pickle.dumps(Eval(), protocol=2))
    with pytest.raises(WeightFileError, match=r"__builtin__\.eval.*refusing"):
        read_torch_checkpoint(path)
    assert not marker.exists()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_non_tensor_globals_are_refused(tmp_path, layout):
    path = save({"weight": torch.ones(2), "counts": collections.Counter("aab")}, tmp_path / "c.pt", layout)
    with pytest.raises(WeightFileError, match="collections.Counter, which is not a tensor"):
        read_torch_checkpoint(path)
    arrays = save({"weight": np.ones(3)}, tmp_path / "numpy.pt", layout)  # numpy's reconstruct functions
    with pytest.raises(WeightFileError, match="numpy"):
        read_torch_checkpoint(arrays)


def test_truncated_and_corrupt_files(tmp_path):
    data = open(default_weights_path(), "rb").read()
    for cut in (len(data) // 2, 200, len(data) - 1):
        (tmp_path / "cut.pth").write_bytes(data[:cut])
        with pytest.raises(WeightFileError, match="truncated|corrupt"):
            read_torch_checkpoint(tmp_path / "cut.pth")
    zipped = save({"w": torch.randn(100)}, tmp_path / "z.pt", "zip").read_bytes()
    (tmp_path / "zcut.pt").write_bytes(zipped[: len(zipped) // 2])
    with pytest.raises(WeightFileError):
        read_torch_checkpoint(tmp_path / "zcut.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "text.pt").write_bytes(b"not a checkpoint at all")
    for name in ("empty.pt", "text.pt", "missing.pt"):
        with pytest.raises(WeightFileError):
            read_torch_checkpoint(tmp_path / name)


def test_a_tensor_reading_outside_its_storage_is_refused(tmp_path):
    # a legacy checkpoint whose tensor claims 10 elements of a 4-element storage
    path = save({"w": torch.arange(4.0)}, tmp_path / "w.pt", "legacy")
    data = path.read_bytes()
    patched = data.replace(b"K\x04\x85", b"K\x0a\x85", 1)  # size (4,) -> (10,)
    assert patched != data
    path.write_bytes(patched)
    with pytest.raises(WeightFileError, match="outside its storage"):
        read_torch_checkpoint(path)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_torch_checkpoint_loads_into_luminar_nn(tmp_path, layout):
    import luminar as lm
    from luminar import nn
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                 torch.nn.Flatten(), torch.nn.Linear(4 * 5 * 5, 6)).eval()
    with torch.no_grad():  # statistics that are not the defaults, so loading them matters
        theirs[1].running_mean.uniform_(-1, 1)
        theirs[1].running_var.uniform_(0.5, 2)
    path = save(theirs.state_dict(), tmp_path / "model.pt", layout)
    ours = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 5 * 5, 6)).eval()
    ours.load_state_dict(load_torch_state_dict(path))  # strict: every name and shape is torch's
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 5)).astype(np.float32)
    g = lm.Graph()
    ours(g.tensor("x", (2, 3, 5, 5))).output("y")
    out = g.compile("reference").set_inputs(ours.inputs(g))(x=x)["y"]
    with torch.no_grad():
        np.testing.assert_allclose(out, theirs(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-5)
