#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4 {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// Headers beyond this are certainly corrupt (the safetensors library uses the same bound).
constexpr uint64_t kMaxHeader = 100ull << 20;

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

int64_t json_nonneg_int(const json& j, const std::string& path, const std::string& tensor, const char* what) {
  if (!j.is_number_integer() || j.get<int64_t>() < 0)
    fail(path, ": tensor '", tensor, "': ", what, " must be non-negative integers, got ", j.dump());
  return j.get<int64_t>();
}

struct RawEntry {
  TensorInfo info;
  uint64_t begin = 0, end = 0;
};

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path, ": cannot stat: ", std::strerror(errno));
  }
  map_size_ = static_cast<size_t>(st.st_size);
  if (map_size_ < 8) {
    ::close(fd);
    fail(path, ": file too small for a safetensors header (", map_size_, " bytes)");
  }
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(path, ": mmap failed: ", std::strerror(errno));
  }
  try {
    const auto* base = static_cast<const uint8_t*>(map_);
    uint64_t hlen = read_le64(base);
    if (hlen > kMaxHeader || hlen > map_size_ - 8)
      fail(path, ": header length ", hlen, " exceeds the file (", map_size_, " bytes)");
    json header;
    try {
      header = json::parse(base + 8, base + 8 + hlen);
    } catch (const json::exception& e) {
      fail(path, ": header is not valid JSON: ", e.what());
    }
    if (!header.is_object()) fail(path, ": header is not a JSON object");

    const uint8_t* data = base + 8 + hlen;
    const uint64_t data_size = map_size_ - 8 - hlen;
    std::vector<RawEntry> entries;
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      const json& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) fail(path, ": __metadata__ must be an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string()) fail(path, ": __metadata__ value of '", m.key(), "' must be a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        fail(path, ": tensor '", name, "' needs dtype, shape and data_offsets");
      RawEntry e;
      e.info.name = name;
      if (!v["dtype"].is_string()) fail(path, ": tensor '", name, "': dtype must be a string");
      try {
        e.info.dtype = dtype_from_name(v["dtype"].get<std::string>());
      } catch (const Error& err) {
        fail(path, ": tensor '", name, "': ", err.what());
      }
      if (!v["shape"].is_array()) fail(path, ": tensor '", name, "': shape must be an array");
      for (const auto& d : v["shape"]) e.info.shape.push_back(json_nonneg_int(d, path, name, "shape"));
      const json& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2) fail(path, ": tensor '", name, "': data_offsets must be [begin, end]");
      e.begin = static_cast<uint64_t>(json_nonneg_int(off[0], path, name, "data_offsets"));
      e.end = static_cast<uint64_t>(json_nonneg_int(off[1], path, name, "data_offsets"));
      if (e.end < e.begin) fail(path, ": tensor '", name, "': data_offsets end < begin");
      if (e.end - e.begin != e.info.nbytes())
        fail(path, ": tensor '", name, "': ", e.end - e.begin, " bytes in data_offsets but shape and dtype need ",
             e.info.nbytes());
      entries.push_back(std::move(e));
    }
    // Report the first tensor (in file order) that lies past the end: that is where a truncation starts.
    std::sort(entries.begin(), entries.end(), [](const RawEntry& a, const RawEntry& b) { return a.begin < b.begin; });
    for (auto& e : entries) {
      if (e.end > data_size)
        fail(path, ": truncated: tensor '", e.info.name, "' needs bytes [", e.begin, ", ", e.end,
             ") of the data section but it has only ", data_size);
      TensorRef ref{std::move(e.info), data + e.begin};
      std::string name = ref.info.name;
      tensors_.emplace(std::move(name), std::move(ref));
    }
  } catch (...) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

// ---------------------------------------------------------------------------------------------

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) fail("checkpoint folder '", dir, "' does not exist");
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::map<std::string, std::string> wanted;  // name -> shard, from the index
  std::vector<std::string> shards;
  if (fs::exists(index)) {
    std::ifstream in(index);
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      fail(index.string(), ": not valid JSON: ", e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail(index.string(), ": missing object 'weight_map'");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) fail(index.string(), ": weight_map entry '", it.key(), "' must be a file name");
      wanted[it.key()] = it.value().get<std::string>();
    }
    if (wanted.empty()) fail(index.string(), ": weight_map lists no tensors");
    for (const auto& [name, shard] : wanted) {
      if (std::find(shards.begin(), shards.end(), shard) != shards.end()) continue;
      if (!fs::exists(fs::path(dir) / shard))
        fail(index.string(), ": shard '", shard, "' (listed for tensor '", name, "') is missing");
      shards.push_back(shard);
    }
    std::sort(shards.begin(), shards.end());
  } else {
    for (const auto& ent : fs::directory_iterator(dir))
      if (ent.is_regular_file() && ent.path().extension() == ".safetensors")
        shards.push_back(ent.path().filename().string());
    std::sort(shards.begin(), shards.end());
    if (shards.empty()) fail("checkpoint folder '", dir, "' has no .safetensors files");
  }

  std::map<std::string, std::string> owner;  // name -> shard that holds it, to catch duplicates
  for (const auto& shard : shards) {
    files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / shard).string()));
    for (const auto& [name, ref] : files_.back()->tensors()) {
      auto [it, fresh] = owner.emplace(name, shard);
      if (!fresh) fail("tensor '", name, "' appears in two shards: '", it->second, "' and '", shard, "'");
      if (wanted.empty() || wanted.count(name)) refs_.emplace(name, ref);
    }
  }
  for (const auto& [name, shard] : wanted)
    if (!refs_.count(name)) fail("index lists tensor '", name, "' in shard '", shard, "' but that shard lacks it");
}

const TensorRef& Checkpoint::get(const std::string& name) const {
  auto it = refs_.find(name);
  if (it == refs_.end()) fail("missing tensor '", name, "' in checkpoint '", dir_, "'");
  return it->second;
}

// ---------------------------------------------------------------------------------------------

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t> bytes) {
  TensorInfo info{name, dtype, shape};
  DSV4_CHECK(bytes.size() == info.nbytes(), "tensor '", name, "': ", bytes.size(), " bytes given, shape and ",
             dtype_name(dtype), " need ", info.nbytes());
  DSV4_CHECK(name != "__metadata__" && !name.empty(), "invalid tensor name '", name, "'");
  DSV4_CHECK(!entries_.count(name), "tensor '", name, "' added twice");
  entries_[name] = Entry{dtype, std::move(shape), std::move(bytes)};
}

void SafetensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());  // host is little-endian (x86-64 / aarch64)
  add(name, DType::F32, std::move(shape), std::move(bytes));
}

namespace {

// Writes the given subset of tensors (names in sorted order) to one file.
template <typename Entries>
void write_file(const std::string& path, const std::vector<std::string>& names, const Entries& entries,
                const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& n : names) {
    const auto& e = entries.at(n);
    header[n] = {{"dtype", std::string(dtype_name(e.dtype))},
                 {"shape", e.shape},
                 {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, ": cannot open for writing");
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(h.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& n : names) {
    const auto& b = entries.at(n).bytes;
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }
  out.close();
  if (!out) fail(path, ": write failed");
}

}  // namespace

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<std::string> names;
  for (const auto& [n, e] : entries_) names.push_back(n);
  write_file(path, names, entries_, metadata_);
}

void SafetensorsWriter::write_folder(const std::string& dir, size_t max_shard_bytes) const {
  fs::create_directories(dir);
  size_t total = 0;
  for (const auto& [n, e] : entries_) total += e.bytes.size();
  if (total <= max_shard_bytes) {
    write((fs::path(dir) / "model.safetensors").string());
    return;
  }
  // Greedy split in name order; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<std::string>> groups(1);
  size_t cur = 0;
  for (const auto& [n, e] : entries_) {
    if (!groups.back().empty() && cur + e.bytes.size() > max_shard_bytes) {
      groups.emplace_back();
      cur = 0;
    }
    groups.back().push_back(n);
    cur += e.bytes.size();
  }
  json weight_map = json::object();
  char buf[64];
  for (size_t i = 0; i < groups.size(); ++i) {
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, groups.size());
    write_file((fs::path(dir) / buf).string(), groups[i], entries_, metadata_);
    for (const auto& n : groups[i]) weight_map[n] = buf;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream out(fs::path(dir) / "model.safetensors.index.json", std::ios::trunc);
  out << index.dump(2) << "\n";
  if (!out) fail(dir, ": cannot write model.safetensors.index.json");
}

}  // namespace dsv4
