"""Chat with SmolLM2-135M-Instruct through the Python API (the `luminar chat` command does the same).

    python examples/chat.py "Why is the sky blue?"
"""
import sys

import luminar.models

model = luminar.models.load(progress=lambda message: print(message, file=sys.stderr))  # the default GGUF, cpu
question = sys.argv[1] if len(sys.argv) > 1 else "What is the capital of France?"
for piece in model.chat(question, max_new_tokens=128, stream=True):  # greedy; temperature=0.7, seed=... to sample
    print(piece, end="", flush=True)
print(f"\n[{model.stats.new_tokens} tokens, {model.stats.tokens_per_second:.1f} tokens/s]", file=sys.stderr)
