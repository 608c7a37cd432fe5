"""LLaVA against transformers: a small random-config LlavaForConditionalGeneration saved with
save_pretrained (plus a CLIPImageProcessor config and a small byte-level BPE tokenizer), loaded
back by luminar; logits, greedy generation and preprocessing compared."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from luminar.errors import InputError, ShapeError, UnsupportedError, WeightFileError  # noqa: E402

CORPUS = ["what is in the picture", "a cat sits on the mat", "the dog runs in the park", "USER: ASSISTANT:"] * 20


def _tokenizer(directory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=290, special_tokens=["<unk>", "<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tk.add_special_tokens(["<image>"])
    tk.save(str(directory / "tokenizer.json"))
    return tk


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, the transformers model, its image processor)."""
    from transformers import CLIPImageProcessorPil, CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration
    from transformers import LlamaConfig
    directory = tmp_path_factory.mktemp("llava")
    tk = _tokenizer(directory)
    torch.manual_seed(0)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                              image_size=28, patch_size=7, initializer_factor=4.0)
    text = LlamaConfig(vocab_size=tk.get_vocab_size(), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       initializer_range=0.1)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=tk.token_to_id("<image>"),
                         image_seq_length=16)
    model = LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(directory)
    processor = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    processor.save_pretrained(directory)
    return directory, model, processor


@pytest.fixture(scope="module")
def llava(checkpoint):
    from luminar.models.llava import load_llava
    return load_llava(checkpoint[0])


def _images():
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (40, 33, 3), dtype=np.uint8)),
            Image.fromarray(rng.integers(0, 256, (30, 50, 3), dtype=np.uint8))]


def _prompt(image_id, n_images, expanded):
    per = 16 if expanded else 1
    ids = [1, 5, 6] + [image_id] * per + [7, 8]
    return ids + ([image_id] * per + [40] if n_images == 2 else []) + [9, 10]


@pytest.mark.parametrize("n_images", [1, 2])
def test_logits_match_transformers(checkpoint, llava, n_images):
    _, model, processor = checkpoint
    images = _images()[:n_images]
    image_id = model.config.image_token_index
    pixels = processor(images=images, return_tensors="np")["pixel_values"]
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([_prompt(image_id, n_images, True)]),
                         pixel_values=torch.tensor(pixels)).logits[0].numpy()
    for ids in (_prompt(image_id, n_images, False), _prompt(image_id, n_images, True)):  # one <image> or expanded
        ours = llava.logits(ids, images)
        assert ours.shape == expected.shape
        np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)
        assert (ours.argmax(-1) == expected.argmax(-1)).all()
    assert np.abs(expected).max() > 0.5  # the random weights are large enough for a meaningful comparison


def test_greedy_generation_matches_transformers(checkpoint, llava):
    _, model, processor = checkpoint
    images = _images()
    ids = _prompt(model.config.image_token_index, 2, True)
    pixels = processor(images=images, return_tensors="np")["pixel_values"]
    with torch.no_grad():
        expected = model.generate(input_ids=torch.tensor([ids]), pixel_values=torch.tensor(pixels), do_sample=False,
                                  max_new_tokens=8, min_new_tokens=8)[0, len(ids):].tolist()
    assert list(llava.generate_ids(ids, images, max_new_tokens=8)) == expected


def test_preprocessing_matches_clip_image_processor(checkpoint, llava, tmp_path):
    _, _, processor = checkpoint
    rng = np.random.default_rng(1)
    rgba = Image.fromarray(rng.integers(0, 256, (37, 29, 4), dtype=np.uint8), "RGBA")  # composited onto white
    gray = Image.fromarray(rng.integers(0, 256, (64, 31), dtype=np.uint8), "L")
    palette = Image.fromarray(rng.integers(0, 256, (20, 45, 3), dtype=np.uint8)).convert("P")
    small = Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8))  # upscaled
    for image in (rgba, gray, palette, small):
        expected = processor(images=[image], return_tensors="np")["pixel_values"][0]
        np.testing.assert_allclose(llava.preprocess(image), expected, atol=1e-6, err_msg=image.mode)
    path = tmp_path / "picture.png"
    rgba.save(path)
    np.testing.assert_allclose(llava.preprocess(path), processor(images=[rgba], return_tensors="np")["pixel_values"][0],
                               atol=1e-6)


def test_bad_inputs(checkpoint, llava, tmp_path):
    _, model, _ = checkpoint
    image_id = model.config.image_token_index
    with pytest.raises(InputError, match="mode 'F'"):
        llava.preprocess(Image.fromarray(np.zeros((30, 30), np.float32), "F"))
    with pytest.raises(InputError, match="mode 'I;16'"):
        llava.preprocess(Image.new("I;16", (30, 30)))
    (tmp_path / "notes.png").write_text("not an image")
    with pytest.raises(InputError, match="not a readable image"):
        llava.preprocess(tmp_path / "notes.png")
    with pytest.raises(InputError, match="no such image"):
        llava.preprocess(tmp_path / "missing.png")
    with pytest.raises(ShapeError, match="image tokens"):
        llava.logits([1, image_id, 5], _images())  # one image token, two images
    with pytest.raises(ShapeError, match="image tokens"):
        llava.logits([1, 5], _images()[:1])


def test_checkpoint_errors(checkpoint, tmp_path):
    import json
    import shutil
    from luminar.models.llava import load_llava
    directory = checkpoint[0]
    with pytest.raises(WeightFileError, match="not a directory"):
        load_llava(directory / "config.json")
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    config = json.loads((copy / "config.json").read_text())
    config["vision_feature_select_strategy"] = "spatial"
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedError, match="vision_feature_select_strategy"):
        load_llava(copy)


def test_vlm_command_answers_like_the_python_api(checkpoint, llava, tmp_path, capsys):
    from luminar.cli import main
    image = tmp_path / "picture.png"
    _images()[0].save(image)
    answer = llava.chat("what is in the picture", [image], max_new_tokens=6)
    prompt = llava.tokenizer.encode("USER: <image>\nwhat is in the picture ASSISTANT:")
    expected = llava.tokenizer.decode(list(llava.generate_ids(prompt, [image], 6, llava.tokenizer.stop_ids)),
                                      skip_special_tokens=True)
    assert answer == expected
    assert main(["vlm", "--model", str(checkpoint[0]), "--image", str(image), "--max-new-tokens", "6", "--quiet",
                 "what is in the picture"]) == 0
    assert capsys.readouterr().out == answer + "\n"


def test_full_strategy_and_last_layer(tmp_path):
    """vision_feature_select_strategy "full" (the class token kept: 17 image tokens) and
    vision_feature_layer -1 (every CLIP layer runs), against transformers."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration
    from luminar.models.llava import load_llava
    torch.manual_seed(1)
    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                              image_size=14, patch_size=7, initializer_factor=4.0, hidden_act="gelu")
    text = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, initializer_range=0.1)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=63, image_seq_length=5,
                         vision_feature_select_strategy="full", vision_feature_layer=-1)
    model = LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(tmp_path)
    pixels = np.random.default_rng(2).standard_normal((1, 3, 14, 14)).astype(np.float32)  # preprocessed
    ids = [1, 2] + [63] * 5 + [3, 4]
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([ids]), pixel_values=torch.tensor(pixels)).logits[0].numpy()
    llava = load_llava(tmp_path)
    assert llava.config.image_tokens == 5 and llava.config.vision_layers_run == 2
    np.testing.assert_allclose(llava.logits(ids, [pixels[0]]), expected, atol=1e-4, rtol=0)
