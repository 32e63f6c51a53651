#!/usr/bin/env python3
"""Oracle goldens for the CPU engine (spec/model.md §10), run on the GPU machine.

For each case folder in --in (an official-format quantised checkpoint written by
`dsv4 make-tiny`, plus case.json with the sequence settings) this script
  1. dequantises the checkpoint itself (FP8 128x128 E8M0 blocks, FP4 e2m1 per-32 E8M0) and
     writes the dequantised twin under official names (no mtp.*: transformers ignores it),
  2. loads it with transformers' DeepseekV4ForCausalLM in fp32 (TF32 off) and checks that no
     key is missing or unexpected,
  3. writes <case>.golden.safetensors: input_ids, full-sequence logits, and logits of
     prefill(P) followed by single-token decode steps through the HF cache; for cases whose
     checkpoint has mtp.0.*, mtp_logits [L-1, V] from the fp32 reference in mtp_reference.py
     fed with HF's last-layer streams.
Independent of the C++ code on purpose: a second reading of the checkpoint format.
"""
import argparse
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors import safe_open
from safetensors.torch import save_file

FP4_LUT = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64)


def e8m0(t):
    return torch.pow(2.0, t.view(torch.uint8).to(torch.float64) - 127.0)


def dequant_fp8(w, s):
    out, inn = w.shape
    scale = e8m0(s) if s.dtype != torch.float32 else s.to(torch.float64)
    scale = scale.repeat_interleave(128, 0)[:out].repeat_interleave(128, 1)[:, :inn]
    return w.to(torch.float64) * scale


def dequant_fp4(w, s):
    b = w.view(torch.uint8).to(torch.long)
    lo, hi = b & 0xF, b >> 4
    codes = torch.stack([lo, hi], dim=-1).reshape(w.shape[0], w.shape[1] * 2)
    vals = FP4_LUT[codes]
    return vals * e8m0(s).repeat_interleave(32, 1)


def read_raw(folder):
    files = [f for f in sorted(os.listdir(folder)) if f.endswith(".safetensors")]
    raw = {}
    for f in files:
        with safe_open(os.path.join(folder, f), framework="pt") as fh:
            for k in fh.keys():
                raw[k] = fh.get_tensor(k)
    return raw


def dequant_tensors(raw, keep):
    """Every non-scale tensor whose name passes keep(), quantised ones dequantised to bf16."""
    out = {}
    for k, t in raw.items():
        if k.endswith(".scale") or not keep(k):
            continue
        if k.endswith(".weight") and (k[:-7] + ".scale") in raw:
            s = raw[k[:-7] + ".scale"]
            if t.dtype == torch.float8_e4m3fn:
                d = dequant_fp8(t, s)
            elif t.dtype in (torch.int8, torch.uint8):
                d = dequant_fp4(t, s)
            else:
                raise SystemExit(f"{k}: unexpected quantised dtype {t.dtype}")
            bf = d.to(torch.bfloat16)
            assert torch.equal(bf.to(torch.float64), d), f"{k}: dequantised value not exact in bf16"
            out[k] = bf
        else:
            out[k] = t
    return out


def load_dequantised(folder):
    return dequant_tensors(read_raw(folder), lambda k: not k.startswith("mtp."))


def load_mtp(folder):
    """mtp.0.* of the case checkpoint (prefix stripped, fp32), or None when it has none."""
    w = dequant_tensors(read_raw(folder), lambda k: k.startswith("mtp.0."))
    return {k[len("mtp.0."):]: v.float() for k, v in w.items()} if w else None


def run_case(case_dir, name, out_dir, device):
    from transformers import DeepseekV4ForCausalLM
    meta = json.load(open(os.path.join(case_dir, "case.json")))
    cfg = json.load(open(os.path.join(case_dir, "config.json")))
    twin = os.path.join("/tmp/goldens-twin", name)
    shutil.rmtree(twin, ignore_errors=True)
    os.makedirs(twin)
    cfg.pop("quantization_config", None)
    cfg.pop("expert_dtype", None)
    json.dump(cfg, open(os.path.join(twin, "config.json"), "w"), indent=1)
    save_file(load_dequantised(case_dir), os.path.join(twin, "model.safetensors"), metadata={"format": "pt"})

    model, info = DeepseekV4ForCausalLM.from_pretrained(twin, torch_dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise SystemExit(f"{name}: loading info not clean: {bad}")
    print(name, "layer_types", getattr(model.config, "layer_types", None),
          "mlp", getattr(model.config, "mlp_layer_types", None),
          "rope", getattr(model.config, "rope_parameters", None), flush=True)
    model = model.to(device).eval()
    # The last decoder layer's output = the streams before hc_head (the MTP module's input).
    captured = {}
    def keep_streams(_mod, _inp, output):
        captured["X"] = (output[0] if isinstance(output, tuple) else output).detach()
    model.model.layers[-1].register_forward_hook(keep_streams)

    g = torch.Generator().manual_seed(int(meta["seed"]))
    L, P = int(meta["seq_len"]), int(meta["decode_prefill"])
    ids = torch.randint(0, cfg["vocab_size"], (L,), generator=g)
    x = ids[None].to(device)
    with torch.no_grad():
        full = model(x, use_cache=False).logits[0].float().cpu()
        streams = captured["X"].float().cpu()
        out = model(x[:, :P], use_cache=True)
        cache = out.past_key_values
        steps = [out.logits[0, -1].float().cpu()]
        for t in range(P, L):
            out = model(x[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits[0, -1].float().cpu())
    dec = torch.stack(steps)
    diff = (dec - full[P - 1:]).abs().max().item()
    print(f"{name}: L={L} P={P} HF decode-vs-full max|d|={diff:.3g} logit std={full.std().item():.3f}", flush=True)
    tensors = {"input_ids": ids.to(torch.int64).contiguous(), "logits": full.contiguous(),
               "decode_logits": dec.contiguous(),
               "decode_prefill": torch.tensor([P], dtype=torch.int64)}
    mtp = load_mtp(case_dir) if cfg.get("num_nextn_predict_layers", 0) >= 1 else None
    if mtp is not None:
        from mtp_reference import mtp_logits
        n, d = cfg["hc_mult"], cfg["hidden_size"]
        assert streams.numel() == L * n * d, f"{name}: last layer output {tuple(streams.shape)} is not [L, n, d]"
        twin_w = load_dequantised(case_dir)
        embed, head = twin_w["embed.weight"].float(), twin_w["head.weight"].float()
        with torch.no_grad():
            # Position t (0..L-2) with token t+1: logits for token t+2.
            ml = mtp_logits(streams.view(L, n, d)[:L - 1], ids[1:], mtp, embed, head, cfg)
        tensors["mtp_logits"] = ml.float().contiguous()
        print(f"{name}: mtp logits {tuple(ml.shape)} std={ml.std().item():.3f}", flush=True)
    save_file(tensors, os.path.join(out_dir, f"{name}.golden.safetensors"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--in", dest="inp", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import transformers
    print("torch", torch.__version__, "transformers", transformers.__version__, "device", a.device, flush=True)
    os.makedirs(a.out, exist_ok=True)
    failed = 0
    for name in sorted(os.listdir(a.inp)):
        try:
            run_case(os.path.join(a.inp, name), name, a.out, a.device)
        except Exception as e:  # keep going: report every case
            import traceback
            traceback.print_exc()
            failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
