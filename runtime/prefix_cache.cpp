#include "runtime/prefix_cache.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

namespace {
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;
}

PrefixCache::PrefixCache(KvBudget& budget, int64_t block) : budget_(&budget), block_(block) {
  DSV4_CHECK(block_ > 0, "prefix cache: block must be positive");
}

PrefixCache::~PrefixCache() { clear(); }

uint64_t PrefixCache::hash_step(uint64_t h, int32_t token) {  // FNV-1a over the token's 4 bytes
  auto u = static_cast<uint32_t>(token);
  for (int i = 0; i < 4; ++i, u >>= 8) h = (h ^ (u & 0xff)) * 0x100000001b3ull;
  return h;
}

PrefixCache::Lru::iterator PrefixCache::find(std::span<const int32_t> prefix, uint64_t hash) const {
  auto [b, e] = index_.equal_range(hash);
  for (auto it = b; it != e; ++it) {
    const auto& t = it->second->tokens;
    if (t.size() == prefix.size() && std::equal(t.begin(), t.end(), prefix.begin())) return it->second;
  }
  return lru_.end();
}

PrefixCache::Hit PrefixCache::lookup(std::span<const int32_t> tokens, int64_t max_len) {
  const int64_t n = std::min<int64_t>(max_len, static_cast<int64_t>(tokens.size()));
  std::vector<uint64_t> hashes;  // hash of each block-aligned prefix
  uint64_t h = kFnvBasis;
  for (int64_t i = 0; i < n; ++i) {
    h = hash_step(h, tokens[i]);
    if ((i + 1) % block_ == 0) hashes.push_back(h);
  }
  for (int64_t k = static_cast<int64_t>(hashes.size()); k > 0; --k) {
    auto it = find(tokens.subspan(0, k * block_), hashes[k - 1]);
    if (it == lru_.end()) continue;
    lru_.splice(lru_.begin(), lru_, it);
    return {it->snap.get(), k * block_};
  }
  return {};
}

bool PrefixCache::contains(std::span<const int32_t> prefix) const {
  uint64_t h = kFnvBasis;
  for (int32_t t : prefix) h = hash_step(h, t);
  return find(prefix, h) != lru_.end();
}

bool PrefixCache::insert(std::span<const int32_t> prefix, std::unique_ptr<BackendSnapshot> snap) {
  DSV4_CHECK(!prefix.empty() && static_cast<int64_t>(prefix.size()) % block_ == 0,
             "prefix cache: prefix length ", prefix.size(), " is not a multiple of the block ", block_);
  DSV4_CHECK(snap && snap->pos() == static_cast<int64_t>(prefix.size()), "prefix cache: snapshot position mismatch");
  uint64_t h = kFnvBasis;
  for (int32_t t : prefix) h = hash_step(h, t);
  if (find(prefix, h) != lru_.end()) return false;
  KvBudget::Reservation r;
  while (!budget_->reserve(r, snap->pos()))
    if (!evict_one()) return false;
  lru_.push_front(Entry{std::vector<int32_t>(prefix.begin(), prefix.end()), h, std::move(snap), std::move(r)});
  index_.emplace(h, lru_.begin());
  return true;
}

void PrefixCache::erase(Lru::iterator it) {
  auto [b, e] = index_.equal_range(it->hash);
  for (auto j = b; j != e; ++j)
    if (j->second == it) {
      index_.erase(j);
      break;
    }
  budget_->release(it->resv);
  lru_.erase(it);
}

bool PrefixCache::evict_one(const BackendSnapshot* keep) {
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    if (it->snap.get() == keep) continue;
    erase(std::next(it).base());
    return true;
  }
  return false;
}

void PrefixCache::clear() {
  while (!lru_.empty()) erase(lru_.begin());
}

size_t PrefixCache::bytes() const {
  size_t b = 0;
  for (const auto& e : lru_) b += e.resv.bytes;
  return b;
}

}  // namespace dsv4
