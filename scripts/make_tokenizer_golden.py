#!/usr/bin/env python3
"""Oracle for the C++ tokenizer (chat/tokenizer.*): trains a small byte-level BPE with the
DeepSeek-V3/V4 pre-tokenizer (serving.md §1.1) and the DeepSeek-V4 added-token table (§1.2)
using Hugging Face `tokenizers`, saves tokenizer.json, and records what HF produces for a
corpus of tricky inputs (ids, decodes, pre-tokenizer pieces).

Run on the GPU machine (it has `tokenizers` 0.23):  python3 scripts/make_tokenizer_golden.py $OUT
Everything is generated here (no downloads); the output is deterministic for a given
`tokenizers` version.  `--corpus-only DIR` writes just the corpus (works without tokenizers).
`--check TOKENIZER_JSON GOLDEN_JSON` re-derives every expected value of an existing golden
with the Python package and reports mismatches (the committed files were produced through
HF's Node binding by scripts/make_tokenizer_golden_node.js; this cross-checks them).
"""
import json
import random
import sys

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"

# serving.md §1.1, regex 3 after JSON unescaping (literal CR/LF inside the classes).
REGEX_DIGITS = r"\p{N}{1,3}"
REGEX_CJK = "[一-龥぀-ゟ゠-ヿ]+"
REGEX_MAIN = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
              "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
              "| ?[\\p{P}\\p{S}]+[\r\n]*"
              "|\\s*[\r\n]+"
              "|\\s+(?!\\S)"
              "|\\s+")

TRAINER_VOCAB = 8960  # 3 specials + 256 byte symbols + 8701 merges (if the corpus allows)
MIN_MERGES = 8000


def added_tokens_after_specials():
    """§1.2 in id order after ids 0..2; (content, special) pairs."""
    toks = [f"<｜place▁holder▁no▁{n}｜>" for n in range(800)]
    toks += ["<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜User｜>", "<｜Assistant｜>", "<|EOT|>"]
    toks += ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
             "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
             "<｜tool▁output▁end｜>", "<｜tool▁sep｜>"]
    toks += ["<｜begin▁of▁repo▁name｜>", "<｜end▁of▁repo▁name｜>", "<｜begin▁of▁file▁name｜>",
             "<｜end▁of▁file▁name｜>", "<｜begin▁of▁file｜>", "<｜end▁of▁file｜>"]
    toks += ["<think>", "</think>", "<｜place▁holder▁for▁copy｜>", "<｜place▁holder▁for▁pointer▁replace｜>",
             "｜DSML｜", "<｜begin▁sys｜>", "<｜end▁sys｜>", "<｜latest_reminder｜>", "<｜action｜>",
             "<｜query｜>", "<｜authority｜>", "<｜domain｜>", "<｜task｜>", "<｜political｜>", "<｜entity｜>",
             "<｜title｜>", "<｜safety｜>", "<｜answer｜>", "<｜search｜>", "<dsml:", "</dsml:",
             "<｜search▁begin｜>", "<｜search▁end｜>", "<｜extracted_url｜>", "<｜read_url｜>",
             "<｜end_of_query｜>"]
    toks += [f"<|place_holder_mm_span_{n:04d}|>" for n in range(21, 436)]
    toks += ["<｜rl_image_pad｜>", "<｜rl_image_start｜>", "<｜image2｜>", "<｜/table>｜", "<｜table｜>",
             "<｜/td｜>", "<｜td｜>", "<｜/tr｜>", "<｜tr｜>", "<｜/polygon｜>", "<｜polygon｜>",
             "<｜/point｜>", "<｜point｜>", "<｜/box｜>", "<｜box｜>", "<｜/ref｜>", "<｜ref｜>", "<｜image｜>"]
    assert len(toks) == 1280, len(toks)
    # <think>/</think> are added as NON-special, normalized tokens so the C++ side's second
    # added-token pass (normalized tokens) and skip_special_tokens are both exercised.
    return [(t, t not in ("<think>", "</think>")) for t in toks]


# ---------------------------------------------------------------------------------------------
# Training corpus (generated, deterministic).
CJK_CHARS = ("的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从"
             "推理答案你好老师毕天气城市温度今天明天北京上海东京数据模型训练语言文字程序代码函数变量")
KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテトナニヌネノ"
SYLL_C = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
          "st", "tr", "ch", "sh", "th", "pl", "gr"]
SYLL_V = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "ie", "y"]
CODE = [
    "def f(x):\n    return x * 2 + 1\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "if __name__ == \"__main__\":\n    main()\n",
    "const auto& v = m.at(\"key\"); // lookup\n",
    "#include <vector>\nstd::vector<int> xs{1, 2, 3};\n",
    "SELECT id, name FROM users WHERE age >= 18;\n",
    "{\"city\": \"Paris\", \"days\": 2, \"ok\": true}\n",
    "<｜DSML｜invoke name=\"get_weather\">\n",
]


def make_training_corpus(rng, n_lines=60000):
    words = []
    for _ in range(30000):
        w = "".join(rng.choice(SYLL_C) + rng.choice(SYLL_V) for _ in range(rng.randint(1, 4)))
        words.append(w)
    cum, acc = [], 0.0
    for i in range(len(words)):  # Zipf-like frequencies
        acc += 1.0 / (i + 1)
        cum.append(acc)
    lines = []
    for i in range(n_lines):
        kind = i % 10
        if kind < 5:
            ws = rng.choices(words, cum_weights=cum, k=rng.randint(4, 16))
            if rng.random() < 0.3:
                ws[0] = ws[0].capitalize()
            lines.append(" ".join(ws) + rng.choice([".", ",", "!", "?", ":", ""]))
        elif kind == 5:
            lines.append("".join(rng.choice(CJK_CHARS) for _ in range(rng.randint(4, 30))) + rng.choice(["。", "，", "！", ""]))
        elif kind == 6:
            lines.append("".join(rng.choice(KANA) for _ in range(rng.randint(3, 12))))
        elif kind == 7:
            lines.append(rng.choice(CODE))
        elif kind == 8:
            lines.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 9))) for _ in range(rng.randint(1, 6))))
        else:
            lines.append(rng.choice([" ", "  ", "\t", "    "]) * rng.randint(1, 4) + rng.choice(words))
    return lines


# ---------------------------------------------------------------------------------------------
# Test corpus: raw bytes (some deliberately invalid UTF-8).
RANDOM_RANGES = [(0x20, 0x7E), (0xA0, 0x17F), (0x370, 0x3FF), (0x400, 0x4FF), (0x600, 0x6FF),
                 (0x900, 0x97F), (0xE00, 0xE5B), (0x300, 0x36F), (0x2000, 0x206F), (0x2100, 0x22FF),
                 (0x2500, 0x257F), (0x3000, 0x303F), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
                 (0xFF00, 0xFFEF), (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x9, 0xD)]


def make_test_corpus(rng):
    texts = [
        "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
        "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>",
        "The quick brown fox jumps over the lazy dog. It's 3:45pm, isn't it?",
        "Don't stop—we'll see you at 10:30 (maybe). \"Quoted\" and 'single' quotes...",
        "中文测试：今天天气很好，我们去公园散步吧。",
        "日本語のテキスト、カタカナとひらがな。漢字もある。",
        "한국어 텍스트 입니다.",
        "Ελληνικά και русский текст, العربية, हिन्दी",
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
        "int main() {\n\tprintf(\"%d\\n\", 42);\r\n\treturn 0;\r\n}\r\n",
        "emoji 😀😃🎉 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨",
        "numbers 1234567890 3.14159 -42 1e10 0x1F 007 ١٢٣٤ ½ ① Ⅻ ²³",
        "   leading spaces and trailing   ",
        "tabs\t\there\t\n\nnewlines\r\n\r\n  mixed \n \n",
        " ",
        "\n",
        "\n\n\n",
        "    \n    ",
        "a" * 1000,
        " " * 3000 + "x",
        "x" + "\n" * 50 + "y",
        "ideographic\u3000space nbsp\u00a0here nel\u0085there ls\u2028ps\u2029 mvs\u180eend",
        "combining e\u0301 \u0301start a\u0308\u0304 ZWJ\u200dZWNJ\u200c BOM\ufeff",
        "controls \x00 \x01 \x07 \x1b[31m red \x7f",
        "!!! ??? ... --- *** ### @user #tag $5 100% a&b a|b ~/path C:\\dir",
        "!Hello ?World .net _private -flag /usr/bin @home [link](url) {obj}",
        "replacement char \ufffd itself",
        "a<｜User｜>b<｜Assistant｜>c",
        "<｜User｜<｜User｜>>",
        "<｜place▁holder▁no▁1｜><｜place▁holder▁no▁12｜><｜place▁holder▁no▁123｜>",
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        "<dsml:foo</dsml:bar <dsml <｜/table>｜<｜table｜>",
        "<|EOT|><|place_holder_mm_span_0021|><|place_holder_mm_span_0435|><|place_holder_mm_span_0436|>",
        "think <think> nested <think></think></think> end",
        EOS + BOS + PAD,
        "<｜begin▁of▁sentence｜",
        "price: ¥1,000 / €9.99 / £5 — “curly” ‘quotes’ «guillemets»",
        "URL https://example.com/a/b?c=d&e=f#frag and email a.b@c.de",
        "CamelCaseWord snake_case_word kebab-case-word UPPER lower",
        "mixed中文English混合123数字",
        "Ⅰ Ⅱ 𝟘𝟙 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕏",
        "\u4e00\u9fa5\u9fa6\u9fff\u3040\u309f\u30a0\u30ff\u3400",
    ]
    items = [{"name": f"text_{i}", "bytes": t.encode("utf-8")} for i, t in enumerate(texts)]
    invalid = [
        b"\xff", b"abc\xffdef", b"\xe4\xb8", b"\xe4\xb8a", b"\xe4\xb8\xad\xe6", b"\xc0\x80",
        b"\xed\xa0\x80 surrogate", b"\xf4\x90\x80\x80 too big", b"\xf0\x9f\x98", b"\x80\x80\x80",
        b"ok \xf8\x88\x80\x80\x80 five-byte", b"\xe0\x80\xaf overlong", b"mid\xc3 dle", b"\xf0\x9f\x98\x80\xf0\x9f",
    ]
    items += [{"name": f"invalid_{i}", "bytes": b} for i, b in enumerate(invalid)]
    for i in range(120):
        n = rng.randint(1, 40)
        cps = []
        for _ in range(n):
            lo, hi = rng.choice(RANDOM_RANGES)
            cps.append(chr(rng.randint(lo, hi)))
        items.append({"name": f"random_{i}", "bytes": "".join(cps).encode("utf-8")})
    # random ASCII with special-token fragments spliced in
    frags = ["<｜User｜>", "<｜", "｜>", "<think>", "</think", "｜DSML｜", " ", "\n", "12", "ab", "!?", "<dsml:"]
    for i in range(40):
        items.append({"name": f"splice_{i}", "bytes": "".join(rng.choice(frags) for _ in range(rng.randint(1, 15))).encode("utf-8")})
    return items


def check(tok_path, golden_path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path)
    g = json.load(open(golden_path, encoding="utf-8"))
    bad = 0
    assert tok.get_vocab_size(with_added_tokens=True) == g["vocab_size"]
    for c in g["cases"]:
        text = bytes.fromhex(c["bytes_hex"]).decode("utf-8", errors="replace")
        ids = tok.encode(text, add_special_tokens=False).ids
        got = {"ids": ids, "pieces": [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)],
               "decoded": tok.decode(ids, skip_special_tokens=False),
               "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
               "per_id_decoded": [tok.decode([i], skip_special_tokens=False) for i in ids[:64]]}
        for k, v in got.items():
            if c[k] != v:
                bad += 1
                print("MISMATCH", c["name"], k)
    for c in g["decode_cases"]:
        if tok.decode(c["ids"], skip_special_tokens=False) != c["decoded"] or \
           tok.decode(c["ids"], skip_special_tokens=True) != c["decoded_skip_special"]:
            bad += 1
            print("MISMATCH decode", c["ids"])
    print(len(g["cases"]), "cases,", len(g["decode_cases"]), "decode cases,", bad, "mismatches")
    sys.exit(1 if bad else 0)


def main():
    rng = random.Random(20260731)
    if len(sys.argv) == 4 and sys.argv[1] == "--check":
        check(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--corpus-only":
        out = sys.argv[2]
        lines = make_training_corpus(rng)
        items = make_test_corpus(rng)
        with open(f"{out}/train.txt", "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
        print(len(lines), "training lines,", sum(len(l) for l in lines), "chars;", len(items), "test items")
        with open(f"{out}/test_items.json", "w", encoding="utf-8") as f:
            json.dump([{"name": it["name"], "bytes_hex": it["bytes"].hex()} for it in items], f)
        return
    out = sys.argv[1]

    import tokenizers
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    try:
        tok.normalizer = normalizers.Sequence([])  # what DeepSeek-V3 ships
    except Exception as e:  # older bindings reject an empty Sequence; no normalizer is equivalent
        print("empty normalizer Sequence rejected:", e)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(REGEX_DIGITS), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(REGEX_CJK), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(REGEX_MAIN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TRAINER_VOCAB, min_frequency=2, show_progress=False,
                                  special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    lines = make_training_corpus(rng)
    tok.train_from_iterator(lines, trainer=trainer)
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1 and tok.token_to_id(PAD) == 2
    base = tok.get_vocab_size(with_added_tokens=True)
    for content, special in added_tokens_after_specials():
        if special:
            tok.add_special_tokens([AddedToken(content, special=True, normalized=False)])
        else:
            tok.add_tokens([AddedToken(content, special=False, normalized=True)])
    tok.save(f"{out}/tokenizer.json")

    tj = json.load(open(f"{out}/tokenizer.json", encoding="utf-8"))
    n_merges = len(tj["model"]["merges"])
    print("tokenizers", tokenizers.__version__, "base vocab", base, "merges", n_merges,
          "total vocab", tok.get_vocab_size(with_added_tokens=True))
    assert n_merges >= MIN_MERGES, n_merges

    # Reload from disk so the goldens describe the file we ship, not the in-memory object.
    tok = Tokenizer.from_file(f"{out}/tokenizer.json")
    cases = []
    for it in make_test_corpus(rng):
        raw = it["bytes"]
        text = raw.decode("utf-8", errors="replace")  # the C++ side applies the same substitution
        ids = tok.encode(text, add_special_tokens=False).ids
        pieces = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
        case = {
            "name": it["name"],
            "bytes_hex": raw.hex(),
            "ids": ids,
            "pieces": pieces,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            "per_id_decoded": [tok.decode([i], skip_special_tokens=False) for i in ids[:64]],
        }
        cases.append(case)
    # Decoding arbitrary id sequences (lossy UTF-8 on token boundaries).
    drng = random.Random(7)
    vocab_total = tok.get_vocab_size(with_added_tokens=True)
    decode_cases = []
    for i in range(60):
        ids = [drng.randrange(vocab_total) for _ in range(drng.randint(1, 12))]
        if i < 20:  # mostly byte tokens, to hit broken multi-byte sequences
            ids = [drng.randrange(3, 259) for _ in range(drng.randint(1, 12))]
        decode_cases.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                             "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    golden = {"tokenizers_version": tokenizers.__version__, "vocab_size": vocab_total,
              "cases": cases, "decode_cases": decode_cases}
    with open(f"{out}/tokenizer_golden.json", "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
    import time
    big = "\n".join(lines)
    t0 = time.perf_counter()
    n_ids = len(tok.encode(big, add_special_tokens=False).ids)
    dt = time.perf_counter() - t0
    print(f"HF encode (one call, one thread): {len(big.encode()) / dt / 1e6:.2f} MB/s, {n_ids} ids")
    mism = sum(1 for c in cases if c["decoded"] != bytes.fromhex(c["bytes_hex"]).decode("utf-8", errors="replace"))
    print(len(cases), "cases;", mism, "do not round-trip through HF decode")


if __name__ == "__main__":
    main()
