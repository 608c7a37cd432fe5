"""luminar.onnx: loading, folding, symbolic dims, external data and errors, checked against onnxruntime.

Small models are built here with onnx.helper, so each test says exactly what it exercises; the
ONNX node suite (test_onnx_nodes.py) and real exported models (test_onnx_models.py) cover breadth.
"""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import luminar.onnx as lo
from luminar.errors import DTypeError, InputError, ShapeError, UnsupportedError, WeightFileError
from luminar.onnx import NeedsConstant

BACKENDS = ["reference", "cpu"]


def make_model(nodes, inputs, outputs, initializers=(), opset=17, domains=()):
    graph = helper.make_graph(nodes, "test_graph", inputs, outputs, initializer=list(initializers))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def tensor(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def ort_run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def mlp_model():
    rng = np.random.default_rng(0)
    w1, b1 = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    w2 = rng.standard_normal((16, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("Gemm", ["r", "w2"], ["logits"], alpha=0.5),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "w2")]
    return make_model(nodes, [tensor("x", TensorProto.FLOAT, ["batch", 8])],
                      [tensor("probs", TensorProto.FLOAT, ["batch", 4])], inits)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mlp_with_symbolic_batch_matches_onnxruntime(backend):
    proto = mlp_model()
    model = lo.load(proto).compile(backend)
    assert [str(i) for i in model.inputs] == ["x: float32 [batch, 8]"]
    assert model.outputs[0].shape == ("batch", 4)
    assert len(model.weights) == 3  # the initializers are weights the program holds
    program = model.program
    for batch in (2, 5):  # one compiled program serves every batch size
        x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
        got = model({"x": x})["probs"]
        np.testing.assert_allclose(got, ort_run(proto, {"x": x})["probs"], rtol=1e-5, atol=1e-6)
    assert model.program is program


def test_shape_subgraph_is_folded_at_load_time():
    # x: (batch, 4, 6) -> Reshape(x, Concat(Shape(x)[0], -1)) -> (batch, 24), the exporters' pattern
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
             helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"]),
             helper.make_node("Concat", ["batch1", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"]),
             helper.make_node("Mul", ["flat", "two"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    proto = make_model(nodes, [tensor("x", TensorProto.FLOAT, ["batch", 4, 6])], [tensor("y", TensorProto.FLOAT, None)],
                       inits)
    model = lo.load(proto)
    ops = {n.op for n in model.graph.nodes}
    assert ops <= {"input", "constant", "mul"}, ops  # no trace of Shape/Gather/Concat: a static reshape view
    model.compile("cpu")
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 4, 6)).astype(np.float32)
        np.testing.assert_array_equal(model({"x": x})["y"], ort_run(proto, {"x": x})["y"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_pool_norm_resize_match_onnxruntime(backend):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    scale, bias = rng.random(6).astype(np.float32) + 0.5, rng.standard_normal(6).astype(np.float32)
    mean, var = rng.standard_normal(6).astype(np.float32), rng.random(6).astype(np.float32) + 0.1
    wt = rng.standard_normal((6, 3, 2, 2)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=2, strides=[2, 1], auto_pad="SAME_UPPER"),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"]),
             helper.make_node("HardSwish", ["bn"], ["a"]),
             helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], pads=[0, 0, 1, 1], ceil_mode=1),
             helper.make_node("Resize", ["p", "", "scales"], ["r"], mode="linear"),
             helper.make_node("ConvTranspose", ["r", "wt"], ["y"], strides=[2, 2], pads=[1, 0, 0, 1], group=3,
                              dilations=[1, 2])]
    inits = [numpy_helper.from_array(a, n) for a, n in [(w, "w"), (scale, "scale"), (bias, "bias"), (mean, "mean"),
                                                          (var, "var"), (wt, "wt")]]
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "scales"))
    proto = make_model(nodes, [tensor("x", TensorProto.FLOAT, [1, 4, 9, 10])], [tensor("y", TensorProto.FLOAT, None)],
                       inits, opset=19)
    x = rng.standard_normal((1, 4, 9, 10)).astype(np.float32)
    got = lo.load(proto).compile(backend)({"x": x})["y"]
    want = ort_run(proto, {"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_lstm_and_integer_outputs_match_onnxruntime():
    rng = np.random.default_rng(2)
    hidden, inp = 5, 3
    w = rng.standard_normal((2, 4 * hidden, inp)).astype(np.float32) * 0.5
    r = rng.standard_normal((2, 4 * hidden, hidden)).astype(np.float32) * 0.5
    b = rng.standard_normal((2, 8 * hidden)).astype(np.float32) * 0.1
    nodes = [helper.make_node("LSTM", ["x", "w", "r", "b"], ["y", "y_h", "y_c"], hidden_size=hidden,
                              direction="bidirectional"),
             helper.make_node("ArgMax", ["y_h"], ["best"], axis=2, keepdims=0),
             helper.make_node("Gather", ["y_c", "picks"], ["picked"], axis=2)]
    inits = [numpy_helper.from_array(a, n) for a, n in [(w, "w"), (r, "r"), (b, "b")]]
    proto = make_model(nodes, [tensor("x", TensorProto.FLOAT, [4, 2, inp]), tensor("picks", TensorProto.INT64, [3])],
                       [tensor("y", TensorProto.FLOAT, None), tensor("best", TensorProto.INT64, None),
                        tensor("picked", TensorProto.FLOAT, None)], inits)
    feeds = {"x": rng.standard_normal((4, 2, inp)).astype(np.float32), "picks": np.array([4, -1, 0], np.int64)}
    got, want = lo.load(proto).compile("cpu")(feeds), ort_run(proto, feeds)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
    assert got["best"].dtype == np.int64
    np.testing.assert_array_equal(got["best"], want["best"])
    np.testing.assert_allclose(got["picked"], want["picked"], rtol=1e-5, atol=1e-6)


def test_if_with_constant_and_runtime_conditions():
    then_graph = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["out_then"])], "then", [],
                                   [tensor("out_then", TensorProto.FLOAT, None)])
    else_graph = helper.make_graph([helper.make_node("Neg", ["x"], ["out_else"])], "else", [],
                                   [tensor("out_else", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Greater", ["flag", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph)]
    proto = make_model(nodes, [tensor("x", TensorProto.FLOAT, [3]), tensor("flag", TensorProto.FLOAT, [])],
                       [tensor("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(np.array(0, np.float32), "zero")])
    x = np.array([1.0, -2.0, 3.0], np.float32)
    folded = lo.load(proto, constants={"flag": np.array(1.0, np.float32)})
    assert [i.name for i in folded.inputs] == ["x"]
    np.testing.assert_array_equal(folded({"x": x})["y"], x * x)
    selected = lo.load(proto).compile("reference")  # a runtime condition: both branches, then a select
    for flag in (1.0, -1.0):
        feeds = {"x": x, "flag": np.array(flag, np.float32)}
        np.testing.assert_array_equal(selected(feeds)["y"], ort_run(proto, feeds)["y"])


def test_external_data_loads_and_missing_or_short_files_are_named(tmp_path):
    proto, saved = mlp_model(), mlp_model()  # (saving moves the copy's tensors out to the side file)
    path = tmp_path / "mlp.onnx"
    onnx.save_model(saved, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="mlp.bin",
                    size_threshold=0)
    x = np.ones((2, 8), np.float32)
    np.testing.assert_allclose(lo.load(path).compile("reference")({"x": x})["probs"], ort_run(proto, {"x": x})["probs"],
                               rtol=1e-5, atol=1e-6)
    data = (tmp_path / "mlp.bin").read_bytes()
    (tmp_path / "mlp.bin").write_bytes(data[:100])
    with pytest.raises(WeightFileError, match="mlp.bin.*truncated"):
        lo.load(path)
    (tmp_path / "mlp.bin").unlink()
    with pytest.raises(WeightFileError, match="mlp.bin.*does not exist"):
        lo.load(path)


def test_malformed_truncated_and_missing_files(tmp_path):
    with pytest.raises(WeightFileError, match="does not exist"):
        lo.load(tmp_path / "nope.onnx")
    (tmp_path / "garbage.onnx").write_bytes(b"\xff\xfe not a protobuf \x00\x01" * 3)
    with pytest.raises(WeightFileError, match="garbage.onnx.*malformed or truncated"):
        lo.load(tmp_path / "garbage.onnx")
    blob = mlp_model().SerializeToString()
    (tmp_path / "short.onnx").write_bytes(blob[:len(blob) // 2])
    with pytest.raises(WeightFileError, match="short.onnx"):
        lo.load(tmp_path / "short.onnx")


def test_unknown_op_unknown_domain_and_data_dependent_ops_fail_at_load():
    x, y = tensor("x", TensorProto.FLOAT, [3]), tensor("y", TensorProto.FLOAT, None)
    with pytest.raises(UnsupportedError, match=r"node 'mystery' \(FooBar, opset 17\).*'FooBar'"):
        lo.load(make_model([helper.make_node("FooBar", ["x"], ["y"], name="mystery")], [x], [y]))
    with pytest.raises(UnsupportedError, match="domain 'com.acme' is not imported"):
        lo.load(make_model([helper.make_node("Relu", ["x"], ["y"], domain="com.acme")], [x], [y]))
    with pytest.raises(UnsupportedError, match=r"node 'nz' \(NonZero, opset 17\).*output shape"):
        lo.load(make_model([helper.make_node("NonZero", ["x"], ["y"], name="nz")], [x], [y]))


def test_runtime_shape_input_names_the_tensor_and_can_be_bound():
    proto = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs")],
                       [tensor("x", TensorProto.FLOAT, [2, 6]), tensor("shape", TensorProto.INT64, [2])],
                       [tensor("y", TensorProto.FLOAT, None)])
    with pytest.raises(NeedsConstant, match=r"node 'rs' \(Reshape, opset 17\).*tensor 'shape'") as info:
        lo.load(proto)
    assert info.value.tensor == "shape"
    model = lo.load(proto, constants={"shape": np.array([3, 4], np.int64)}).compile("reference")
    assert model({"x": np.arange(12, dtype=np.float32).reshape(2, 6)})["y"].shape == (3, 4)


def test_wrong_inputs_are_named():
    model = lo.load(mlp_model()).compile("reference")
    with pytest.raises(ShapeError, match=r"input 'x' must have shape \['batch', 8\].*axis 1: expected 8, got 7"):
        model({"x": np.zeros((2, 7), np.float32)})
    with pytest.raises(ShapeError, match="input 'x' must have rank 2"):
        model({"x": np.zeros(8, np.float32)})
    with pytest.raises(DTypeError, match="input 'x' must be float32, got int32"):
        model({"x": np.zeros((2, 8), np.int32)})
    with pytest.raises(InputError, match="missing input 'x'"):
        model({})
    with pytest.raises(InputError, match="unknown input 'z'"):
        model({"x": np.zeros((2, 8), np.float32), "z": np.zeros(1)})


def test_cli_describes_and_runs_a_model(tmp_path, capsys):
    from luminar.cli import main
    proto = mlp_model()
    onnx.save(proto, str(tmp_path / "mlp.onnx"))
    x = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["onnx", str(tmp_path / "mlp.onnx")]) == 0
    text = capsys.readouterr().out
    assert "x: float32 [batch, 8]" in text and "probs: float32 [batch, 4]" in text and "1  Softmax" in text
    assert main(["onnx", str(tmp_path / "mlp.onnx"), "--input", f"x={tmp_path / 'x.npy'}", "--out-dir",
                 str(tmp_path / "out"), "--backend", "reference"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "out" / "probs.npy"), ort_run(proto, {"x": x})["probs"],
                               rtol=1e-5, atol=1e-6)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["probs.npy"]  # no temporary left behind
    assert main(["onnx", str(tmp_path / "mlp.onnx"), "--input", "x=missing.npy"]) == 1
    assert "input 'x': file 'missing.npy' does not exist" in capsys.readouterr().err


def test_symbolic_sizes_flow_into_values_and_same_padding():
    # Shape of a symbolic input used as data, and a strided SAME_UPPER conv whose pads depend on the size
    w = np.random.default_rng(4).standard_normal((2, 1, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["s", "s"], ["squares"]),
             helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], auto_pad="SAME_UPPER")]
    proto = make_model(nodes, [tensor("x", TensorProto.FLOAT, [1, 1, "h", "w"])],
                       [tensor("sf", TensorProto.FLOAT, [4]), tensor("squares", TensorProto.INT64, [4]),
                        tensor("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
    model = lo.load(proto).compile("cpu")
    for h, width in ((5, 8), (6, 7)):  # odd and even sizes: different pads, one compiled program
        x = np.random.default_rng(h).standard_normal((1, 1, h, width)).astype(np.float32)
        got, want = model({"x": x}), ort_run(proto, {"x": x})
        np.testing.assert_array_equal(got["sf"], [1, 1, h, width])
        assert got["squares"].dtype == np.int64
        np.testing.assert_array_equal(got["squares"], want["squares"])
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_depthwise_conv_with_large_kernel_matches_onnxruntime(backend):
    # 5x5 depthwise kernels take the windowed form (ops_nn._depthwise): multiplier 2, stride, dilation, bias
    rng = np.random.default_rng(5)
    w, b = rng.standard_normal((6, 1, 5, 5)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=3, strides=[2, 1], dilations=[1, 2],
                            pads=[2, 3, 1, 4])
    proto = make_model([node], [tensor("x", TensorProto.FLOAT, [2, 3, 11, 12])], [tensor("y", TensorProto.FLOAT, None)],
                       [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    x = rng.standard_normal((2, 3, 11, 12)).astype(np.float32)
    got, want = lo.load(proto).compile(backend)({"x": x})["y"], ort_run(proto, {"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
