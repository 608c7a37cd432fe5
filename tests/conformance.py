"""The op conformance suite the GPU backends run: representative op tests of other files.

Each entry is (a test function of another file, its parameters); the function takes a
`backend` argument and compares that backend's result with its torch reference. The opencl
tests run them on their device (tests/test_opencl.py); the cuda tests compile every kernel of
every graph they build for sm_90 (tests/test_cuda.py) and run them where a GPU is found.
Then the checks both device runtimes share: a small Llama against transformers, its KV cache
left on the device (bytes copied per decode step), a training step's state left there; and the
fused attention kernel the GPU targets' online (flash) forms compute.
"""
import numpy as np
import pytest

import luminar as lm

import test_elementwise as elementwise
import test_graph as graph_tests
import test_indexing as indexing
import test_linalg as linalg
import test_nn as nn_tests
import test_nn_ops as nn_ops
import test_reduce as reduce_tests

CONFORMANCE = [
    *[(elementwise.test_unary_op_matches_torch, {"name": n})
      for n in ("gelu", "erf", "tanh", "sigmoid", "log1p", "expm1", "cos", "round", "sign", "rsqrt")],
    (elementwise.test_unary_op_at_large_and_tiny_values, {"name": "softplus"}),
    (elementwise.test_erf_max_abs_error_is_below_1e_minus_6_on_minus_6_to_6, {}),
    *[(elementwise.test_binary_op_broadcasts_like_torch, {"name": n}) for n in ("sub", "div_floor", "pow_operator", "remainder")],
    (elementwise.test_division_by_zero_gives_torch_infinities_and_nan, {"name": "div"}),
    (elementwise.test_clamp_handles_infinities_exactly_and_propagates_nan, {}),
    (elementwise.test_round_breaks_ties_to_even, {}),
    *[(reduce_tests.test_reduction_over_dims, {"name": n, "dim": d, "keepdim": False})
      for n, d in (("sum", (0, 2)), ("amax", -1), ("var", None), ("logsumexp", (-1, 1)))],
    (reduce_tests.test_softmax_family, {"name": "softmax", "dim": -1}),
    (reduce_tests.test_softmax_family_is_stable_for_large_inputs, {"name": "log_softmax"}),
    (reduce_tests.test_softmax_with_masked_entries, {}),
    (reduce_tests.test_logsumexp_of_all_negative_infinity_is_negative_infinity, {}),
    (reduce_tests.test_argmax_argmin_return_first_index_on_ties, {"name": "argmax", "dim": 1, "keepdim": False}),
    (reduce_tests.test_cumsum, {"dim": 1}),
    (linalg.test_matmul_function_and_reflected_operator, {}),
    (linalg.test_bmm_with_symbolic_batch_and_seq, {}),
    (linalg.test_linear_with_symbolic_batch_and_seq, {}),
    (linalg.test_linear_on_a_transposed_input, {}),
    (nn_ops.test_layer_norm_eps_and_symbolic_sequence, {}),
    (nn_ops.test_conv2d_with_symbolic_batch_and_image_size, {}),
    (nn_ops.test_max_pool2d_padding_never_wins_over_negative_inputs, {}),
    (indexing.test_embedding_with_symbolic_sequence, {}),
    (indexing.test_gather_with_symbolic_dims, {}),
    (indexing.test_masked_fill_with_a_symbolic_causal_mask, {}),
    (indexing.test_cat_along_symbolic_dims, {}),
    (graph_tests.test_design_example_runs_and_binds_s_at_run_time, {}),
    (graph_tests.test_bfloat16_matches_torch_rounding, {}),
    (graph_tests.test_set_inputs_keeps_weights_across_calls, {}),
    (nn_tests.test_multihead_attention_masks_and_weights_match_torch, {}),
]


def small_llama_matches_transformers(backend: str, tmp_path):
    """A 2-layer random Llama (test_llama's) on `backend`: the logits of a prompt against
    transformers, then decoding token by token through the KV cache against the full recompute.
    Returns the model and the prompt's ids (for checks of its own a backend adds)."""
    import numpy as np
    import test_llama as llama
    reference = llama._small_model("llama")
    reference.save_pretrained(tmp_path)
    model = llama.load(tmp_path, backend=backend)
    ids = llama.IDS
    full = model.logits(ids)
    np.testing.assert_allclose(full, llama._reference_logits(reference, ids), atol=1e-4, rtol=0)
    cache = model.new_cache(capacity=2)
    np.testing.assert_allclose(model.forward(ids[:6], cache, last_only=False), full[:6], atol=1e-5, rtol=0)
    for i in range(6, 9):
        np.testing.assert_allclose(model.forward(ids[i:i + 1], cache)[-1], full[i], atol=1e-5, rtol=0)
    return model, ids


def kv_cache_stays_on_the_device(model, ids):
    """Decoding copies to the device the new token and its keys and values, not the cache: the
    bytes a step copies in do not grow with the tokens seen, and are a fraction of the cache.
    The logits are those of the host path (every call copying the whole cache), bit for bit."""
    program, config = model.program, model.config
    row = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4  # one token's keys + values
    cache, steps = model.new_cache(capacity=len(ids)), []
    resident = [model.forward(ids[:4], cache, last_only=False)]
    for i in range(4, len(ids)):
        before = program.transfers.to_device
        resident.append(model.forward(ids[i:i + 1], cache))
        steps.append(program.transfers.to_device - before)
    # the first step copies the prompt's keys and values (appended on the host after the prefill), then
    # each step the previous token's, and the token id
    assert steps == [4 * row + 4] + [row + 4] * (len(ids) - 5)
    assert steps[-1] * 4 < cache.length * row  # (the whole cache, which the host path copies, is larger)
    appended, program._appended = program._appended, set()
    try:  # the host path
        cache, copied = model.new_cache(capacity=len(ids)), program.transfers.to_device
        host = [model.forward(ids[:4], cache, last_only=False)] + [model.forward(ids[i:i + 1], cache) for i in range(4, len(ids))]
        assert program.transfers.to_device - copied >= sum(range(5, len(ids) + 1)) * row
    finally:
        program._appended = appended
    for a, b in zip(resident, host):
        np.testing.assert_array_equal(a, b)


def train_step_keeps_its_state_on_the_device(backend: str):
    """Adam on least squares (test_optim's): losses and the state dict as on the reference
    backend; a step copies in its batch and out its loss and step count, not the parameters."""
    import test_optim as optim_tests
    from luminar.optim import Adam
    batches = optim_tests.least_squares_batches(4)
    ours, theirs = optim_tests.least_squares(backend, Adam(lr=0.1)), optim_tests.least_squares("reference", Adam(lr=0.1))
    for batch in batches:
        before = ours.program.transfers.to_host
        assert ours.step(batch) == pytest.approx(theirs.step(batch), rel=1e-5)
        assert ours.program.transfers.to_host - before <= 64  # (the loss, grad norm and step counter: scalars)
    mine, reference = ours.state_dict(), theirs.state_dict()
    assert set(mine) == set(reference)
    for key in reference:
        np.testing.assert_allclose(mine[key], reference[key], rtol=1e-5, atol=1e-6, err_msg=key)


def updated_state_stays_on_the_device(backend: str):
    """An update w <- w - x / 2 over three calls: the state and the output as numpy's; the device
    buffer stays the current value (the held host array is the state: no upload next call)."""
    g = lm.Graph()
    w, x = g.tensor("w", (4,)), g.tensor("x", (4,))
    g.update(w, w - x * 0.5)
    (w * 1.0).sum().output("total")
    program = g.compile(backend).set_inputs(w=np.ones(4, np.float32))
    step = np.array([1, 2, 3, 4], np.float32)
    for k in range(1, 4):
        out = program(x=step)
        np.testing.assert_allclose(program.state["w"], 1 - 0.5 * k * step)
        np.testing.assert_allclose(out["total"], (1 - 0.5 * (k - 1) * step).sum())
    assert program._inputs["w"][0] is program.state["w"]


def fused_attention(**shape):
    """The naive attention graph lowered with its softmax inlined, and the online kernel."""
    from luminar.compiler.kernels import Lowering
    from luminar.compiler.online import fusion_regions, online_plan
    from luminar.compiler.passes import optimize
    from test_fusion import attention_graph
    lowering = Lowering(optimize(attention_graph(**shape)))
    lowering.run()
    fused = Lowering(lowering.graph, frozenset().union(*(r for _, r in fusion_regions(lowering)))).run()
    (kernel,) = [k for k in fused.kernels if online_plan(k) is not None]
    return fused, kernel


def search_fuses_attention_into_the_online_form(backend: str, fuse, monkeypatch):
    """With the fusion forced (`fuse`: test_fusion's fixture; timings aside), the attention is one
    online kernel, right against the reference backend; the 0/1 mask input masks every key of
    the first row (softmax of equal scores: the mean of v). Two of the online blocks are timed."""
    from luminar.backends.opencl import space as space_module
    from luminar.backends.opencl.schedules import Online
    from test_fusion import attention_graph, attention_inputs
    monkeypatch.setattr(space_module, "ONLINE_FORMS", (Online(16, 32, 4), Online(8, 64, 8)))
    fuse(True)
    shape = dict(heads=3, rows=70, keys=130, dim=16, mask="input")
    g, arrays = attention_graph(**shape), attention_inputs(**shape)
    program = g.compile(backend, search=2)
    assert [f.chosen for f in program.fusions] == [True]
    assert [c.schedule.kind for per in program.choices.values() for c in per if c.source == "fused"] == ["online"]
    assert "online softmax" in program.explain()
    np.testing.assert_allclose(program(**arrays)["o"], g.compile("reference")(**arrays)["o"], rtol=1e-4, atol=1e-5)
