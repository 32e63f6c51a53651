// Local oracle path (same Rust core as the Python package: HF `tokenizers` 0.23.2 through
// its official Node binding), used when the GPU machine is unavailable. Produces the same
// files as scripts/make_tokenizer_golden.py:
//   python3 scripts/make_tokenizer_golden.py --corpus-only DIR      (corpus + test items)
//   NODE_PATH=<dir with node_modules/tokenizers> node scripts/make_tokenizer_golden_node.js DIR OUT
// The Node binding can only train with the default BpeTrainer, so the trained model is cut
// to its first MERGES merges and re-laid-out DeepSeek-style (ids 0..2 sentence specials,
// 3..258 the 256 byte symbols, then merge results), the §1.2 added tokens are appended, and
// HF re-saves the file. All ids/decodes in the golden come from HF encode()/decode().
const { Tokenizer, byteLevelAlphabet } = require("tokenizers");
const fs = require("fs");
const path = require("path");
const [dir, out] = process.argv.slice(2);
const MERGES = 8701;

const R3 = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const skeleton = {
  version: "1.0", truncation: null, padding: null, added_tokens: [],
  normalizer: { type: "Sequence", normalizers: [] },
  pre_tokenizer: { type: "Sequence", pretokenizers: [
    { type: "Split", pattern: { Regex: "\\p{N}{1,3}" }, behavior: "Isolated", invert: false },
    { type: "Split", pattern: { Regex: "[一-龥぀-ゟ゠-ヿ]+" }, behavior: "Isolated", invert: false },
    { type: "Split", pattern: { Regex: R3 }, behavior: "Isolated", invert: false },
    { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
  post_processor: null,
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
           fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: {}, merges: [] },
};

// serving.md §1.2 after ids 0..2 (kept in sync with make_tokenizer_golden.py).
function addedTable() {
  const t = [];
  for (let n = 0; n < 800; n++) t.push(`<｜place▁holder▁no▁${n}｜>`);
  t.push("<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜User｜>", "<｜Assistant｜>", "<|EOT|>");
  t.push("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
         "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>");
  t.push("<｜begin▁of▁repo▁name｜>", "<｜end▁of▁repo▁name｜>", "<｜begin▁of▁file▁name｜>", "<｜end▁of▁file▁name｜>",
         "<｜begin▁of▁file｜>", "<｜end▁of▁file｜>");
  t.push("<think>", "</think>", "<｜place▁holder▁for▁copy｜>", "<｜place▁holder▁for▁pointer▁replace｜>", "｜DSML｜",
         "<｜begin▁sys｜>", "<｜end▁sys｜>", "<｜latest_reminder｜>", "<｜action｜>", "<｜query｜>", "<｜authority｜>",
         "<｜domain｜>", "<｜task｜>", "<｜political｜>", "<｜entity｜>", "<｜title｜>", "<｜safety｜>", "<｜answer｜>",
         "<｜search｜>", "<dsml:", "</dsml:", "<｜search▁begin｜>", "<｜search▁end｜>", "<｜extracted_url｜>",
         "<｜read_url｜>", "<｜end_of_query｜>");
  for (let n = 21; n < 436; n++) t.push(`<|place_holder_mm_span_${String(n).padStart(4, "0")}|>`);
  t.push("<｜rl_image_pad｜>", "<｜rl_image_start｜>", "<｜image2｜>", "<｜/table>｜", "<｜table｜>", "<｜/td｜>", "<｜td｜>",
         "<｜/tr｜>", "<｜tr｜>", "<｜/polygon｜>", "<｜polygon｜>", "<｜/point｜>", "<｜point｜>", "<｜/box｜>", "<｜box｜>",
         "<｜/ref｜>", "<｜ref｜>", "<｜image｜>");
  if (t.length !== 1280) throw new Error("added table size " + t.length);
  return t;
}

function bytesToUnicode() {  // GPT-2 order by byte value
  const out = [];
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    out.push(String.fromCodePoint(printable ? b : 256 + extra++));
  }
  return out;
}

(async () => {
  const tmp = path.join(out, "trained_full.json");
  const t0 = Tokenizer.fromString(JSON.stringify(skeleton));
  t0.train([path.join(dir, "train.txt")]);
  t0.save(tmp, false);
  const trained = JSON.parse(fs.readFileSync(tmp, "utf8"));
  fs.unlinkSync(tmp);
  const alpha = bytesToUnicode();
  if (new Set(alpha).size !== 256 || !byteLevelAlphabet().every(c => alpha.includes(c))) throw new Error("alphabet");

  const specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"];
  const vocab = {};
  let next = 0;
  for (const s of specials) vocab[s] = next++;
  for (const c of alpha) vocab[c] = next++;
  const merges = [];
  for (const m of trained.model.merges) {
    if (merges.length === MERGES) break;
    const [a, b] = Array.isArray(m) ? m : m.split(" ");
    if (!(a in vocab) || !(b in vocab)) throw new Error("merge uses a dropped token: " + a + " " + b);
    merges.push([a, b]);
    if (!((a + b) in vocab)) vocab[a + b] = next++;
  }
  if (merges.length < 8000) throw new Error("too few merges " + merges.length);
  const tj = JSON.parse(JSON.stringify(skeleton));
  tj.model.vocab = vocab;
  tj.model.merges = merges;
  specials.forEach((s, i) => tj.added_tokens.push({ id: i, content: s, single_word: false, lstrip: false, rstrip: false,
                                                     normalized: false, special: true }));
  for (const s of addedTable()) {
    // <think>/</think> non-special + normalized: exercises the second added-token pass.
    const plain = s === "<think>" || s === "</think>";
    tj.added_tokens.push({ id: next++, content: s, single_word: false, lstrip: false, rstrip: false,
                           normalized: plain, special: !plain });
  }
  const tok = Tokenizer.fromString(JSON.stringify(tj));
  tok.save(path.join(out, "tokenizer.json"), true);  // HF's own serialization
  const t = Tokenizer.fromFile(path.join(out, "tokenizer.json"));

  const items = JSON.parse(fs.readFileSync(path.join(dir, "test_items.json"), "utf8"));
  const dec = new TextDecoder("utf-8", { fatal: false });  // WHATWG == Python "replace"
  const cases = [];
  for (const it of items) {
    const text = dec.decode(Buffer.from(it.bytes_hex, "hex"));
    const ids = (await t.encode(text, null, { addSpecialTokens: false })).getIds();
    const pieces = t.getPreTokenizer().preTokenizeString(text).map(p => p[0]);
    const per = [];
    for (const i of ids.slice(0, 64)) per.push(await t.decode([i], false));
    cases.push({ name: it.name, bytes_hex: it.bytes_hex, ids, pieces, decoded: await t.decode(ids, false),
                 decoded_skip_special: await t.decode(ids, true), per_id_decoded: per });
  }
  const V = t.getVocabSize(true);
  let seed = 7;
  const rnd = n => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
  const decodeCases = [];
  for (let i = 0; i < 60; i++) {
    const len = 1 + rnd(12), ids = [];
    for (let k = 0; k < len; k++) ids.push(i < 20 ? 3 + rnd(256) : rnd(V));  // first 20: raw byte tokens
    decodeCases.push({ ids, decoded: await t.decode(ids, false), decoded_skip_special: await t.decode(ids, true) });
  }
  const big = fs.readFileSync(path.join(dir, "train.txt"), "utf8");
  const s0 = process.hrtime.bigint();
  const n = (await t.encode(big, null, { addSpecialTokens: false })).getIds().length;
  const secs = Number(process.hrtime.bigint() - s0) / 1e9;
  fs.writeFileSync(path.join(out, "tokenizer_golden.json"),
                   JSON.stringify({ oracle: "HF tokenizers 0.23.2 (node binding)", vocab_size: V, merges: merges.length,
                                    cases, decode_cases: decodeCases }, null, 0));
  console.log(`vocab ${V}, merges ${merges.length}, ${cases.length} cases; HF encode ${(Buffer.byteLength(big) / secs / 1e6).toFixed(2)} MB/s (${n} ids)`);
})();
