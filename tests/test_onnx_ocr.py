"""examples/ocr.py reads the text of an image end to end (PP-OCRv6 detection + recognition on luminar).

The test renders two lines of known text with Pillow's bundled font and requires the example to
print exactly those lines, top to bottom.
"""
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageDraw, ImageFont

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ocr.py"
LINES = ["LUMINAR 2026", "onnx import works"]


@pytest.mark.slow
def test_ocr_example_reads_the_rendered_text(tmp_path):
    image = Image.new("RGB", (480, 160), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=36)
    for k, line in enumerate(LINES):
        draw.text((20, 20 + 70 * k), line, fill="black", font=font)
    image.save(tmp_path / "text.png")
    result = subprocess.run([sys.executable, str(EXAMPLE), str(tmp_path / "text.png")], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    texts = [line.split("\t")[0] for line in result.stdout.strip().splitlines()]
    assert texts == LINES


def test_ocr_example_reports_an_unreadable_image(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"not an image")
    result = subprocess.run([sys.executable, str(EXAMPLE), str(tmp_path / "broken.png")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1
    assert "cannot read image" in result.stderr
