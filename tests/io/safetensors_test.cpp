#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A raw file: 8-byte LE header length, header text, data bytes (for malformed-file tests).
void write_raw(const std::string& path, const std::string& header, size_t data_bytes, uint64_t claimed_len = 0) {
  std::ofstream out(path, std::ios::binary);
  uint64_t len = claimed_len ? claimed_len : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(len >> (8 * i)));
  out << header;
  for (size_t i = 0; i < data_bytes; ++i) out.put(0);
}

TEST(Safetensors, RoundTripsEveryDtype) {
  TempDir dir;
  SafetensorsWriter w;
  const DType all[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E8M0,
                       DType::I64, DType::I32, DType::I16, DType::I8, DType::U8, DType::BOOL};
  std::map<std::string, std::vector<uint8_t>> want;
  uint32_t seed = 1;
  for (DType t : all) {
    std::string name = std::string("t.").append(dtype_name(t));
    auto bytes = random_bytes(3 * 5 * dtype_size(t), seed++);
    want[name] = bytes;
    w.add(name, t, {3, 5}, bytes);
  }
  w.add("scalar", DType::F32, {}, random_bytes(4, 99));
  w.add("empty", DType::BF16, {0, 7}, {});
  w.add_f32("f32", {2, 2}, {1.0f, -2.5f, 3.25f, 0.0f});
  w.set_metadata("format", "pt");
  const std::string path = dir.file("a.safetensors");
  w.write(path);

  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.tensors().size(), std::size(all) + 3);
  for (DType t : all) {
    const auto& r = f.tensors().at(std::string("t.").append(dtype_name(t)));
    EXPECT_EQ(r.info.dtype, t);
    EXPECT_EQ(r.info.shape, (std::vector<int64_t>{3, 5}));
    const auto& b = want.at(r.info.name);
    ASSERT_EQ(r.info.nbytes(), b.size());
    EXPECT_EQ(std::memcmp(r.data, b.data(), b.size()), 0) << r.info.name;
  }
  EXPECT_TRUE(f.tensors().at("scalar").info.shape.empty());
  EXPECT_EQ(f.tensors().at("scalar").info.numel(), 1);
  EXPECT_EQ(f.tensors().at("empty").info.numel(), 0);
  float vals[4];
  std::memcpy(vals, f.tensors().at("f32").data, 16);
  EXPECT_EQ(vals[1], -2.5f);
  EXPECT_EQ(vals[2], 3.25f);
  // The header is padded so the data section starts 8-byte aligned (mmap base is page aligned).
  const uint8_t* start = nullptr;
  for (const auto& [n, r] : f.tensors()) start = (!start || r.data < start) ? r.data : start;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(start) % 8, 0u);
}

TEST(Safetensors, WriterRejectsWrongByteCount) {
  SafetensorsWriter w;
  EXPECT_ERROR_HAS(w.add("x", DType::BF16, {4}, std::vector<uint8_t>(7)), "x", "8");
  w.add("x", DType::U8, {1}, {1});
  EXPECT_ERROR_HAS(w.add("x", DType::U8, {1}, {1}), "x");
}

TEST(Safetensors, SingleFileFolder) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("a", DType::U8, {4}, {1, 2, 3, 4});
  w.write_folder(dir.str(), 1 << 20);
  EXPECT_TRUE(fs::exists(dir.file("model.safetensors")));
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors.index.json")));
  Checkpoint ck(dir.str());
  EXPECT_EQ(ck.get("a").data[3], 4);
  EXPECT_ERROR_HAS(ck.get("nope"), "nope");
}

TEST(Safetensors, ShardedFolderWithIndex) {
  TempDir dir;
  SafetensorsWriter w;
  size_t total = 0;
  for (int i = 0; i < 10; ++i) {
    auto b = random_bytes(100, i);
    total += b.size();
    w.add("w." + std::to_string(i), DType::U8, {100}, b);
  }
  w.add("big", DType::U8, {1000}, random_bytes(1000, 42));  // larger than a shard: own shard
  total += 1000;
  w.write_folder(dir.str(), 250);
  std::ifstream in(dir.file("model.safetensors.index.json"));
  auto idx = nlohmann::json::parse(in);
  EXPECT_EQ(idx["metadata"]["total_size"].get<size_t>(), total);
  EXPECT_EQ(idx["weight_map"].size(), 11u);
  std::set<std::string> shards;
  for (auto& [k, v] : idx["weight_map"].items()) shards.insert(v.get<std::string>());
  EXPECT_GT(shards.size(), 3u);
  const std::string n = std::to_string(shards.size());
  EXPECT_TRUE(shards.count("model-00001-of-0000" + n + ".safetensors")) << *shards.begin();

  Checkpoint ck(dir.str());
  EXPECT_EQ(ck.tensors().size(), 11u);
  auto b3 = random_bytes(100, 3);
  EXPECT_EQ(std::memcmp(ck.get("w.3").data, b3.data(), 100), 0);
  EXPECT_EQ(ck.get("big").info.shape, (std::vector<int64_t>{1000}));
}

TEST(Safetensors, FolderWithoutIndexReadsAllFilesAndRejectsDuplicates) {
  TempDir dir;
  SafetensorsWriter a, b;
  a.add("x", DType::U8, {1}, {7});
  b.add("y", DType::U8, {1}, {8});
  a.write(dir.file("a.safetensors"));
  b.write(dir.file("b.safetensors"));
  {
    Checkpoint ck(dir.str());
    EXPECT_EQ(ck.get("x").data[0], 7);
    EXPECT_EQ(ck.get("y").data[0], 8);
  }
  SafetensorsWriter c;
  c.add("x", DType::U8, {1}, {9});
  c.write(dir.file("c.safetensors"));
  EXPECT_ERROR_HAS(Checkpoint(dir.str()), "'x'", "a.safetensors", "c.safetensors");
}

TEST(Safetensors, EmptyOrMissingFolder) {
  TempDir dir;
  EXPECT_ERROR_HAS(Checkpoint(dir.str()), "no .safetensors");
  EXPECT_ERROR_HAS(Checkpoint(dir.file("absent")), "absent");
}

TEST(Safetensors, IndexNamingMissingShard) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("x", DType::U8, {1}, {1});
  w.write(dir.file("s1.safetensors"));
  std::ofstream(dir.file("model.safetensors.index.json"))
      << R"({"metadata": {}, "weight_map": {"x": "s1.safetensors", "layers.9.w": "s2.safetensors"}})";
  EXPECT_ERROR_HAS(Checkpoint(dir.str()), "s2.safetensors", "layers.9.w");
}

TEST(Safetensors, IndexNamingTensorTheShardLacks) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("x", DType::U8, {1}, {1});
  w.write(dir.file("s1.safetensors"));
  std::ofstream(dir.file("model.safetensors.index.json"))
      << R"({"weight_map": {"x": "s1.safetensors", "ghost": "s1.safetensors"}})";
  EXPECT_ERROR_HAS(Checkpoint(dir.str()), "ghost", "s1.safetensors");
}

TEST(Safetensors, BadIndexJson) {
  TempDir dir;
  std::ofstream(dir.file("model.safetensors.index.json")) << "{weight_map";
  EXPECT_ERROR_HAS(Checkpoint(dir.str()), "model.safetensors.index.json", "JSON");
  std::ofstream(dir.file("model.safetensors.index.json")) << R"({"metadata": {}})";
  EXPECT_ERROR_HAS(Checkpoint(dir.str()), "weight_map");
  std::ofstream(dir.file("model.safetensors.index.json")) << R"({"weight_map": {}})";
  EXPECT_ERROR_HAS(Checkpoint(dir.str()), "no tensors");
}

TEST(Safetensors, TruncatedFileNamesFileAndFirstTensorOutside) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("a", DType::F32, {16}, random_bytes(64, 1));
  w.add("b", DType::F32, {16}, random_bytes(64, 2));
  w.add("c", DType::F32, {16}, random_bytes(64, 3));
  const std::string path = dir.file("t.safetensors");
  w.write(path);
  fs::resize_file(path, fs::file_size(path) - 100);  // cuts into b (bytes 64..128), c is gone too
  std::string msg = test::error_of([&] { SafetensorsFile f(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("'b'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(Safetensors, MalformedHeaders) {
  TempDir dir;
  const std::string p = dir.file("m.safetensors");
  const std::string ok = R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})";

  write_raw(p, ok, 8, 1ull << 40);
  EXPECT_ERROR_HAS(SafetensorsFile(p), p.c_str(), "header length");
  write_raw(p, ok, 8, ok.size() + 9);  // claims 1 byte more than the file holds
  EXPECT_ERROR_HAS(SafetensorsFile(p), "header length");
  { std::ofstream(p) << "abc"; }
  EXPECT_ERROR_HAS(SafetensorsFile(p), p.c_str(), "too small");
  write_raw(p, R"({"w":{"dtype":"BF16",)", 8);
  EXPECT_ERROR_HAS(SafetensorsFile(p), p.c_str(), "JSON");
  write_raw(p, R"([1,2])", 0);
  EXPECT_ERROR_HAS(SafetensorsFile(p), "object");
  write_raw(p, R"({"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 1);
  EXPECT_ERROR_HAS(SafetensorsFile(p), "'w'", "F4");
  write_raw(p, R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,6]}})", 8);
  EXPECT_ERROR_HAS(SafetensorsFile(p), "'w'", "6 bytes", "8");
  write_raw(p, R"({"w":{"dtype":"BF16","shape":[2,2]}})", 8);
  EXPECT_ERROR_HAS(SafetensorsFile(p), "'w'", "data_offsets");
  write_raw(p, R"({"w":{"dtype":"BF16","shape":[-2,2],"data_offsets":[0,8]}})", 8);
  EXPECT_ERROR_HAS(SafetensorsFile(p), "'w'", "shape");
  write_raw(p, R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,0]}})", 8);
  EXPECT_ERROR_HAS(SafetensorsFile(p), "'w'", "end < begin");
  write_raw(p, R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[4,12]}})", 8);
  EXPECT_ERROR_HAS(SafetensorsFile(p), "'w'", "truncated");
  write_raw(p, R"({"__metadata__":{"k":1}})", 0);
  EXPECT_ERROR_HAS(SafetensorsFile(p), "__metadata__");
  write_raw(p, ok, 8);
  EXPECT_EQ(SafetensorsFile(p).tensors().size(), 1u);  // the same bytes, well formed, load
}

}  // namespace
}  // namespace dsv4
