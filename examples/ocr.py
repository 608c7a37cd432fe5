"""Read the text in an image with RapidOCR's PP-OCRv6 ONNX models, run by luminar.

    python examples/ocr.py IMAGE [--cls] [--backend cpu|reference]

The pipeline of PaddleOCR, each network an ONNX graph that `luminar.onnx` compiles:

1. detection (PP-OCRv6 det, a DB text detector): the image, scaled so its sides are multiples
   of 32 (the longer side at most 960), gives a text-probability map; pixels above 0.3 form
   connected regions, each region with a mean probability of at least 0.5 becomes a box, grown
   by DB's unclip rule (area * 1.6 / perimeter on every side);
2. optional direction classification (`--cls`: the mobile text-direction classifier): crops it
   finds upside down (label 180, score > 0.9) are turned;
3. recognition (PP-OCRv6 rec, CTC): each crop, resized to height 48 (width padded to 320), gives
   per-column class scores; repeated classes and blanks are dropped and the rest looked up in
   the character dictionary stored in the model's metadata (plus a space, as PaddleOCR does).

Prints one line per text box, top to bottom: the text, its mean character confidence and box.
Axis-aligned boxes only (no rotated text); the models come from the `rapidocr` package.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import sys

import numpy as np

import luminar.onnx

DET_MEAN, DET_STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
REC_HEIGHT, REC_WIDTH = 48, 320
CLS_SHAPE = (48, 192)


def model_path(name: str) -> str:
    return str(importlib.metadata.distribution("rapidocr").locate_file(f"rapidocr/models/{name}"))


def load_image(path: str) -> np.ndarray:
    from PIL import Image
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def resize(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    from PIL import Image
    return np.asarray(Image.fromarray(pixels).resize((width, height), Image.BILINEAR))


class OCR:
    def __init__(self, backend: str = "cpu", use_cls: bool = False):
        self.backend, self.use_cls = backend, use_cls
        self._detectors = {}
        self.recognizer = luminar.onnx.load(model_path("PP-OCRv6_rec_small.onnx"),
                                            dims={"DynamicDimension.0": 1, "DynamicDimension.1": REC_WIDTH})
        meta = {p.key: p.value for p in self.recognizer.proto.metadata_props}
        self.characters = ["<blank>"] + meta["character"].split("\n") + [" "]
        self.recognizer.compile(backend)
        self.classifier = None
        if use_cls:
            self.classifier = luminar.onnx.load(model_path("ch_ppocr_mobile_v2.0_cls_mobile.onnx"),
                                                dims={"x_dim0": 1, "x_dim2": CLS_SHAPE[0], "x_dim3": CLS_SHAPE[1]})
            self.classifier.compile(backend)

    # -- detection --------------------------------------------------------------------------------
    def detector(self, height: int, width: int):
        """One compiled detector per input size (the graph's dims are fixed at load time)."""
        if (height, width) not in self._detectors:
            model = luminar.onnx.load(model_path("PP-OCRv6_det_small.onnx"), dims={
                "DynamicDimension.0": 1, "DynamicDimension.1": height, "DynamicDimension.2": width})
            self._detectors[(height, width)] = model.compile(self.backend)
        return self._detectors[(height, width)]

    def detect(self, pixels: np.ndarray) -> list[tuple[int, int, int, int]]:
        """Text boxes (top, left, bottom, right) in the image's pixel coordinates."""
        from scipy import ndimage
        h, w = pixels.shape[:2]
        scale = min(1.0, 960 / max(h, w))
        height, width = (max(32, int(round(d * scale / 32)) * 32) for d in (h, w))
        x = (resize(pixels, height, width) / 255.0 - DET_MEAN) / DET_STD
        x = x.transpose(2, 0, 1)[None].astype(np.float32)
        model = self.detector(height, width)
        prob = model({"x": x})[model.outputs[0].name][0, 0]
        regions, count = ndimage.label(prob > 0.3)
        boxes = []
        for k, found in enumerate(ndimage.find_objects(regions), start=1):
            inside = regions[found] == k
            if prob[found][inside].mean() < 0.5 or inside.sum() < 4:
                continue
            rows, cols = found
            box_h, box_w = rows.stop - rows.start, cols.stop - cols.start
            grow = box_h * box_w * 1.6 / (2 * (box_h + box_w))  # DB's unclip distance for a rectangle
            top, left = max(rows.start - grow, 0), max(cols.start - grow, 0)
            bottom, right = min(rows.stop + grow, height), min(cols.stop + grow, width)
            boxes.append((int(top * h / height), int(left * w / width), int(np.ceil(bottom * h / height)),
                          int(np.ceil(right * w / width))))
        return sorted(boxes)

    # -- direction and recognition -----------------------------------------------------------------
    def upright(self, crop: np.ndarray) -> np.ndarray:
        if self.classifier is None:
            return crop
        x = self._line_input(crop, *CLS_SHAPE)
        scores = self.classifier({"x": x})[self.classifier.outputs[0].name][0]
        return crop[::-1, ::-1] if scores.argmax() == 1 and scores[1] > 0.9 else crop

    @staticmethod
    def _line_input(crop: np.ndarray, height: int, max_width: int) -> np.ndarray:
        """Resize to `height` keeping the aspect ratio (at most max_width), normalize, pad to max_width."""
        width = min(max_width, max(1, int(np.ceil(height * crop.shape[1] / crop.shape[0]))))
        line = (resize(crop, height, width) / 255.0 - 0.5) / 0.5
        padded = np.zeros((height, max_width, 3))
        padded[:, :width] = line
        return padded.transpose(2, 0, 1)[None].astype(np.float32)

    def recognize(self, crop: np.ndarray) -> tuple[str, float]:
        x = self._line_input(crop, REC_HEIGHT, REC_WIDTH)
        scores = self.recognizer({"x": x})[self.recognizer.outputs[0].name][0]  # (columns, classes)
        best, confidence = scores.argmax(-1), scores.max(-1)
        text, kept, previous = [], [], 0
        for index, score in zip(best, confidence):
            if index != 0 and index != previous:  # CTC: drop blanks and repeats
                text.append(self.characters[index])
                kept.append(score)
            previous = index
        return "".join(text), float(np.mean(kept)) if kept else 0.0

    def read(self, pixels: np.ndarray) -> list[tuple[str, float, tuple]]:
        results = []
        for top, left, bottom, right in self.detect(pixels):
            text, confidence = self.recognize(self.upright(pixels[top:bottom, left:right]))
            if text.strip():
                results.append((text, confidence, (left, top, right, bottom)))
        return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Read the text in an image (PP-OCRv6 on luminar).")
    parser.add_argument("image", help="an image file (anything Pillow reads)")
    parser.add_argument("--cls", action="store_true", help="also classify the text direction (turn upside-down crops)")
    parser.add_argument("--backend", default="cpu", choices=["cpu", "reference"])
    args = parser.parse_args(argv)
    try:
        pixels = load_image(args.image)
    except (OSError, ValueError) as e:
        print(f"ocr: cannot read image {args.image!r}: {e}", file=sys.stderr)
        return 1
    ocr = OCR(args.backend, use_cls=args.cls)
    for text, confidence, (left, top, right, bottom) in ocr.read(pixels):
        print(f"{text}\t{confidence:.3f}\t[{left}, {top}, {right}, {bottom}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
