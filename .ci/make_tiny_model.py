#!/usr/bin/env python3
"""Write a small random-weight Llama (HF format: config.json + safetensors) that a real vLLM can load and serve.
No download: the weights are random, so the text is meaningless, but every engine mechanism is real.  Run with
the vLLM venv's python (it needs torch and transformers).  Usage: make_tiny_model.py OUT_DIR [--layers 4]
[--hidden 256].  (A copy of the project's shared tiny-model writer, so that CI needs nothing outside the repo.)"""
import argparse
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--hidden", type=int, default=256)
ap.add_argument("--max-len", type=int, default=8192)
a = ap.parse_args()
cfg = LlamaConfig(hidden_size=a.hidden, intermediate_size=2 * a.hidden, num_attention_heads=4,
                  num_key_value_heads=2, num_hidden_layers=a.layers, vocab_size=32000,
                  max_position_embeddings=a.max_len, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                  torch_dtype="bfloat16")
torch.manual_seed(0)
tmp = a.out.rstrip("/") + ".tmp"
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp)
os.replace(tmp, a.out)  # whole or absent: a reader never sees half a model
print(a.out)
