// Validates the full V4-Flash / V4-Pro tensor manifests (spec §3.2, written by
// scripts/make_manifest.py independently of model/inventory.cpp) against the real configs.
#include <gtest/gtest.h>

#include "io/config.h"
#include "manifest.h"
#include "model/inventory.h"
#include "test_util.h"

namespace dsv4 {
namespace {

const std::string kData = std::string(DSV4_SOURCE_DIR) + "/tests/io/data/";

struct Model {
  ModelConfig cfg;
  std::map<std::string, TensorInfo> tensors;
};

const Model& flash() {
  static Model m{load_config(kData + "config-v4-flash.json"), test::load_manifest(kData + "manifest-v4-flash.tsv")};
  return m;
}
const Model& pro() {
  static Model m{load_config(kData + "config-v4-pro.json"), test::load_manifest(kData + "manifest-v4-pro.tsv")};
  return m;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

TEST(Inventory, RealFlashManifestValidates) {
  const auto& m = flash();
  EXPECT_EQ(m.tensors.size(), 69187u);  // spec §3.1
  CheckpointFormat f = validate_checkpoint(m.cfg, m.tensors);
  EXPECT_EQ(f.linears, LinearFormat::FP8Block);
  EXPECT_EQ(f.experts, LinearFormat::FP4Group32);
  EXPECT_TRUE(f.has_mtp);
  EXPECT_EQ(expected_tensors(m.cfg, f).size(), 69187u);
}

TEST(Inventory, RealProManifestValidates) {
  const auto& m = pro();
  EXPECT_EQ(m.tensors.size(), 145116u);  // derived from spec §3.2 (Pro is not listed in §3.1)
  CheckpointFormat f = validate_checkpoint(m.cfg, m.tensors);
  EXPECT_EQ(f.experts, LinearFormat::FP4Group32);
  EXPECT_TRUE(f.has_mtp);
}

TEST(Inventory, MtpIsAllOrNothing) {
  auto t = flash().tensors;
  for (auto it = t.begin(); it != t.end();) it = it->first.rfind("mtp.", 0) == 0 ? t.erase(it) : std::next(it);
  EXPECT_EQ(t.size(), 69187u - 1575u);
  EXPECT_FALSE(validate_checkpoint(flash().cfg, t).has_mtp);

  auto partial = flash().tensors;
  partial.erase("mtp.0.e_proj.scale");
  EXPECT_ERROR_HAS(validate_checkpoint(flash().cfg, partial), "mtp.0.e_proj.scale", "MTP");
}

TEST(Inventory, MissingTensorIsNamed) {
  auto t = flash().tensors;
  t.erase("layers.17.ffn.experts.100.w2.scale");
  EXPECT_ERROR_HAS(validate_checkpoint(flash().cfg, t), "layers.17.ffn.experts.100.w2.scale");
  t = flash().tensors;
  t.erase("layers.4.attn.indexer.compressor.ape");  // CSA-only part
  EXPECT_ERROR_HAS(validate_checkpoint(flash().cfg, t), "layers.4.attn.indexer.compressor.ape");
}

TEST(Inventory, WrongShapeIsNamedWithBothShapes) {
  auto t = flash().tensors;
  t["layers.3.attn.compressor.wkv.weight"].shape = {1024, 4096};  // HCA layer given the CSA shape
  EXPECT_ERROR_HAS(validate_checkpoint(flash().cfg, t), "layers.3.attn.compressor.wkv.weight", "[1024, 4096]",
                   "[512, 4096]");
  t = flash().tensors;
  t["layers.42.attn.wo_a.scale"].shape = {64, 31};
  EXPECT_ERROR_HAS(validate_checkpoint(flash().cfg, t), "layers.42.attn.wo_a.scale", "[64, 31]", "[64, 32]");
}

TEST(Inventory, WrongDtypeIsNamed) {
  auto t = flash().tensors;
  t["layers.5.hc_ffn_fn"].dtype = DType::BF16;
  EXPECT_ERROR_HAS(validate_checkpoint(flash().cfg, t), "layers.5.hc_ffn_fn", "BF16", "F32");
  t = flash().tensors;
  t["layers.8.ffn.experts.3.w1.scale"].dtype = DType::F32;  // FP4 scales are E8M0 only
  EXPECT_ERROR_HAS(validate_checkpoint(flash().cfg, t), "layers.8.ffn.experts.3.w1.scale", "F8_E8M0");
  t = flash().tensors;
  t["layers.0.attn.wq_a.weight"].dtype = DType::I16;
  EXPECT_ERROR_HAS(validate_checkpoint(flash().cfg, t), "layers.0.attn.wq_a.weight", "I16");
}

TEST(Inventory, UnexpectedTensorIsNamed) {
  auto t = flash().tensors;
  t["layers.0.ffn.gate.bias"] = TensorInfo{"layers.0.ffn.gate.bias", DType::F32, {256}};  // hash layer: no bias
  EXPECT_ERROR_HAS(validate_checkpoint(flash().cfg, t), "layers.0.ffn.gate.bias", "unexpected");
  t = flash().tensors;
  t["layers.1.attn.compressor.ape"] = TensorInfo{"layers.1.attn.compressor.ape", DType::F32, {4, 1024}};  // SWA layer
  EXPECT_ERROR_HAS(validate_checkpoint(flash().cfg, t), "layers.1.attn.compressor.ape");
  t = flash().tensors;
  t["model.embed_tokens.weight"] = TensorInfo{"model.embed_tokens.weight", DType::BF16, {129280, 4096}};
  EXPECT_ERROR_HAS(validate_checkpoint(flash().cfg, t), "model.embed_tokens.weight");
}

TEST(Inventory, AcceptsFlashBaseLayout) {
  // Flash-Base (spec §2.1 notes): FP8 experts with 128x128 blocks, all FP8 scales stored as F32.
  std::map<std::string, TensorInfo> t;
  for (auto [name, info] : flash().tensors) {
    const bool expert = name.find(".experts.") != std::string::npos;
    if (expert && ends_with(name, ".weight")) {
      info.dtype = DType::F8_E4M3;
      info.shape[1] *= 2;  // unpacked
    } else if (expert && ends_with(name, ".scale")) {
      int64_t out = info.shape[0], in = info.shape[1] * 32;
      info.shape = {(out + 127) / 128, (in + 127) / 128};
      info.dtype = DType::F32;
    } else if (ends_with(name, ".scale")) {
      info.dtype = DType::F32;
    }
    t[name] = info;
  }
  EXPECT_EQ(t.at("layers.3.ffn.experts.0.w1.scale").shape, (std::vector<int64_t>{16, 32}));  // spec value
  CheckpointFormat f = validate_checkpoint(flash().cfg, t);
  EXPECT_EQ(f.experts, LinearFormat::FP8Block);
  EXPECT_EQ(f.linears, LinearFormat::FP8Block);
}

TEST(Inventory, AcceptsDequantisedTwin) {
  // The oracle's twin (spec §10): same names, BF16 weights, no `.scale`; tid2eid may be I32.
  std::map<std::string, TensorInfo> t;
  for (auto [name, info] : flash().tensors) {
    if (ends_with(name, ".scale")) continue;
    if (info.dtype == DType::F8_E4M3) info.dtype = DType::BF16;
    if (info.dtype == DType::I8) {
      info.dtype = DType::BF16;
      info.shape[1] *= 2;
    }
    if (info.dtype == DType::I64) info.dtype = DType::I32;
    t[name] = info;
  }
  CheckpointFormat f = validate_checkpoint(flash().cfg, t);
  EXPECT_EQ(f.linears, LinearFormat::Dense);
  EXPECT_EQ(f.experts, LinearFormat::Dense);
  t.erase("layers.9.attn.wkv.weight");
  EXPECT_ERROR_HAS(validate_checkpoint(flash().cfg, t), "layers.9.attn.wkv.weight");
}

TEST(Inventory, ProScheduleShapes) {
  // Pro layers 0-1 are HCA: compressor [512, 7168], ape [128, 512], and no indexer.
  auto t = pro().tensors;
  ASSERT_TRUE(t.count("layers.0.attn.compressor.ape"));
  EXPECT_FALSE(t.count("layers.0.attn.indexer.wq_b.weight"));
  t["layers.0.attn.indexer.wq_b.weight"] = TensorInfo{"layers.0.attn.indexer.wq_b.weight", DType::F8_E4M3, {8192, 1536}};
  EXPECT_ERROR_HAS(validate_checkpoint(pro().cfg, t), "layers.0.attn.indexer.wq_b.weight");
}

}  // namespace
}  // namespace dsv4
