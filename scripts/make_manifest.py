#!/usr/bin/env python3
"""Writes the tensor manifests of the real DeepSeek-V4-Flash and V4-Pro checkpoints.

Written independently of the C++ inventory code, straight from the table in spec/model.md
§3.2 (Flash shapes verified there, Pro shapes in brackets) and the layer schedule of §2.1, with
the literal numbers copied from that table rather than computed from the config.

Output: tests/io/data/manifest-v4-flash.tsv and manifest-v4-pro.tsv. To keep them small each row
is a template: name<TAB>dtype<TAB>shape<TAB>expand, where expand is "-" or "VAR=list[;VAR=list]"
(list: comma-separated integers and inclusive a-b ranges) and {VAR} in the name is substituted.
Usage: python3 scripts/make_manifest.py [out_dir]
"""
import os
import sys

E8 = "F8_E8M0"
FP8 = "F8_E4M3"


def ranges(xs):
    """[0,1,2,5,7,8,9] -> '0-2,5,7-9'."""
    xs = sorted(xs)
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else "%d-%d" % (xs[i], xs[j]))
        i = j + 1
    return ",".join(out)


# Literal values from spec §3.2 (column "shape Flash [Pro]"). Scales of FP8 weights are listed too.
FLASH = dict(
    d=[4096], hc_fn=[24, 16384], hc_head_fn=[4, 16384],
    wq_a=([1024, 4096], [8, 32]), q_norm=[1024], wq_b=([32768, 1024], [256, 8]),
    wkv=([512, 4096], [4, 32]), wo_a=([8192, 4096], [64, 32]), wo_b=([4096, 8192], [32, 64]),
    sink=[64], csa_cmp=[1024, 4096], hca_cmp=[512, 4096],
    idx_wq_b=([8192, 1024], [64, 8]), idx_wproj=[64, 4096], idx_cmp=[256, 4096],
    gate=[256, 4096], bias=[256], experts=256,
    ew13=([2048, 2048], [2048, 128]), ew2=([4096, 1024], [4096, 64]),
    sw13=([2048, 4096], [16, 32]), sw2=([4096, 2048], [32, 16]),
    embed=[129280, 4096], proj=([4096, 4096], [32, 32]),
    layers=43, swa=[0, 1], csa=list(range(2, 43, 2)), hca=list(range(3, 42, 2)), mtp=1,
)
PRO = dict(
    d=[7168], hc_fn=[24, 28672], hc_head_fn=[4, 28672],
    wq_a=([1536, 7168], [12, 56]), q_norm=[1536], wq_b=([65536, 1536], [512, 12]),
    wkv=([512, 7168], [4, 56]), wo_a=([16384, 4096], [128, 32]), wo_b=([7168, 16384], [56, 128]),
    sink=[128], csa_cmp=[1024, 7168], hca_cmp=[512, 7168],
    idx_wq_b=([8192, 1536], [64, 12]), idx_wproj=[64, 7168], idx_cmp=[256, 7168],
    gate=[384, 7168], bias=[384], experts=384,
    ew13=([3072, 3584], [3072, 224]), ew2=([7168, 1536], [7168, 96]),
    sw13=([3072, 7168], [24, 56]), sw2=([7168, 3072], [56, 24]),
    embed=[129280, 7168], proj=([7168, 7168], [56, 56]),
    layers=61, swa=[], csa=list(range(2, 61, 2)), hca=[0, 1] + list(range(3, 60, 2)), mtp=1,
)
HASH_LAYERS = [0, 1, 2]  # spec §2.1: hash MoE on layers 0-2 (both models)


def rows_for(m):
    rows = []

    def add(name, dtype, shape, expand="-"):
        rows.append((name, dtype, ",".join(str(x) for x in shape), expand))

    def fp8(prefix, ws, expand):
        add(prefix + ".weight", FP8, ws[0], expand)
        add(prefix + ".scale", E8, ws[1], expand)

    every = "L=" + ranges(range(m["layers"]))
    mtp = "J=" + ranges(range(m["mtp"]))

    # Top level.
    add("embed.weight", "BF16", m["embed"])
    add("head.weight", "BF16", m["embed"])
    add("norm.weight", "BF16", m["d"])
    add("hc_head_fn", "F32", m["hc_head_fn"])
    add("hc_head_base", "F32", [4])
    add("hc_head_scale", "F32", [1])

    # Parts every main layer and the MTP block share (SWA block).
    for p, exp in (("layers.{L}.", every), ("mtp.{J}.", mtp)):
        add(p + "attn_norm.weight", "BF16", m["d"], exp)
        add(p + "ffn_norm.weight", "BF16", m["d"], exp)
        for s in ("attn", "ffn"):
            add(p + "hc_%s_fn" % s, "F32", m["hc_fn"], exp)
            add(p + "hc_%s_base" % s, "F32", [24], exp)
            add(p + "hc_%s_scale" % s, "F32", [3], exp)
        fp8(p + "attn.wq_a", m["wq_a"], exp)
        add(p + "attn.q_norm.weight", "BF16", m["q_norm"], exp)
        fp8(p + "attn.wq_b", m["wq_b"], exp)
        fp8(p + "attn.wkv", m["wkv"], exp)
        add(p + "attn.kv_norm.weight", "BF16", [512], exp)
        fp8(p + "attn.wo_a", m["wo_a"], exp)
        fp8(p + "attn.wo_b", m["wo_b"], exp)
        add(p + "attn.attn_sink", "F32", m["sink"], exp)
        add(p + "ffn.gate.weight", "BF16", m["gate"], exp)
        ex = exp + ";E=" + ranges(range(m["experts"]))
        for w in ("w1", "w3"):
            add(p + "ffn.experts.{E}.%s.weight" % w, "I8", m["ew13"][0], ex)
            add(p + "ffn.experts.{E}.%s.scale" % w, E8, m["ew13"][1], ex)
        add(p + "ffn.experts.{E}.w2.weight", "I8", m["ew2"][0], ex)
        add(p + "ffn.experts.{E}.w2.scale", E8, m["ew2"][1], ex)
        fp8(p + "ffn.shared_experts.w1", m["sw13"], exp)
        fp8(p + "ffn.shared_experts.w3", m["sw13"], exp)
        fp8(p + "ffn.shared_experts.w2", m["sw2"], exp)

    # Router extras: tid2eid on hash layers, bias elsewhere (and on the MTP block).
    add("layers.{L}.ffn.gate.tid2eid", "I64", [129280, 6], "L=" + ranges(HASH_LAYERS))
    add("layers.{L}.ffn.gate.bias", "F32", m["bias"], "L=" + ranges(set(range(m["layers"])) - set(HASH_LAYERS)))
    add("mtp.{J}.ffn.gate.bias", "F32", m["bias"], mtp)

    # Compressors (CSA and HCA layers).
    for kind, cmp_shape, ape in (("csa", m["csa_cmp"], [4, 1024]), ("hca", m["hca_cmp"], [128, 512])):
        if not m[kind]:
            continue
        exp = "L=" + ranges(m[kind])
        add("layers.{L}.attn.compressor.wkv.weight", "BF16", cmp_shape, exp)
        add("layers.{L}.attn.compressor.wgate.weight", "BF16", cmp_shape, exp)
        add("layers.{L}.attn.compressor.ape", "F32", ape, exp)
        add("layers.{L}.attn.compressor.norm.weight", "BF16", [512], exp)

    # Lightning indexer (CSA layers).
    exp = "L=" + ranges(m["csa"])
    fp8("layers.{L}.attn.indexer.wq_b", m["idx_wq_b"], exp)
    add("layers.{L}.attn.indexer.weights_proj.weight", "BF16", m["idx_wproj"], exp)
    add("layers.{L}.attn.indexer.compressor.wkv.weight", "BF16", m["idx_cmp"], exp)
    add("layers.{L}.attn.indexer.compressor.wgate.weight", "BF16", m["idx_cmp"], exp)
    add("layers.{L}.attn.indexer.compressor.ape", "F32", [4, 256], exp)
    add("layers.{L}.attn.indexer.compressor.norm.weight", "BF16", [128], exp)

    # MTP-only tensors.
    fp8("mtp.{J}.e_proj", m["proj"], mtp)
    fp8("mtp.{J}.h_proj", m["proj"], mtp)
    for nm in ("enorm", "hnorm", "norm"):
        add("mtp.{J}.%s.weight" % nm, "BF16", m["d"], mtp)
    add("mtp.{J}.hc_head_fn", "F32", m["hc_head_fn"], mtp)
    add("mtp.{J}.hc_head_base", "F32", [4], mtp)
    add("mtp.{J}.hc_head_scale", "F32", [1], mtp)
    return rows


def expand_count(exp):
    if exp == "-":
        return 1
    n = 1
    for part in exp.split(";"):
        k = 0
        for item in part.split("=", 1)[1].split(","):
            a, _, b = item.partition("-")
            k += int(b) - int(a) + 1 if b else 1
        n *= k
    return n


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "io", "data")
    for tag, label, m in (("v4-flash", "DeepSeek-V4-Flash", FLASH), ("v4-pro", "DeepSeek-V4-Pro", PRO)):
        rows = rows_for(m)
        total = sum(expand_count(r[3]) for r in rows)
        path = os.path.join(out_dir, "manifest-%s.tsv" % tag)
        with open(path, "w") as f:
            f.write("# %s tensor manifest from spec/model.md section 3.2 (scripts/make_manifest.py); "
                    "%d tensors\n" % (label, total))
            f.write("# name\tdtype\tshape\texpand\n")
            for r in rows:
                f.write("\t".join(r) + "\n")
        print(path, total)


if __name__ == "__main__":
    main()
