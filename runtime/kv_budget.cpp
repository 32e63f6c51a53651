#include "runtime/kv_budget.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>

#include "core/error.h"
#include "model/mtp_feed.h"

namespace dsv4 {

namespace {
constexpr size_t kF32 = sizeof(float);

// Rows of projected compressor inputs a layer keeps after `t` tokens (model/compressor.cpp):
// the open window, plus for CSA the whole previous window once one has closed.
int64_t pending_rows(int64_t t, int64_t m, bool overlap) {
  if (!overlap) return t % m;
  return t < m ? t : m + t % m;
}
}  // namespace

StateCosts state_costs(const ModelConfig& cfg, int64_t speculative_tokens) {
  cfg.validate();
  StateCosts c;
  const size_t D = static_cast<size_t>(cfg.head_dim), dI = static_cast<size_t>(cfg.index_head_dim);
  c.window_bytes = static_cast<size_t>(cfg.num_layers) * static_cast<size_t>(cfg.sliding_window) * D * kF32;
  std::map<std::pair<int, int64_t>, size_t> entry, keys;  // (kind, ratio) → bytes per entry over layers
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const AttnKind k = cfg.layer_kinds[l];
    if (k == AttnKind::SWA) continue;
    const int64_t m = cfg.compress_ratio[l];
    const bool csa = k == AttnKind::CSA;
    entry[{static_cast<int>(k), m}] += D * kF32;
    // a and z rows; CSA rows are 2c wide (overlap halves), the indexer has its own compressor.
    size_t row = 2 * (csa ? 2 * D : D) * kF32;
    if (csa) {
      keys[{static_cast<int>(k), m}] += dI * kF32;
      row += 2 * 2 * dI * kF32;
    }
    c.pending_ratio.push_back(m);
    c.pending_row_bytes.push_back(row);
    c.pending_overlap.push_back(csa);
    c.pending_max_bytes += static_cast<size_t>(csa ? 2 * m - 1 : m - 1) * row;
  }
  if (speculative_tokens > 0) {
    const int64_t n = speculative_tokens + 1;
    c.mtp_bytes = static_cast<size_t>(cfg.sliding_window) * D * kF32 +
                  MtpFeed::max_bytes(cfg.hc_mult * cfg.hidden_size, cfg.sliding_window);
    for (size_t i = 0; i < c.pending_ratio.size(); ++i) {
      const int64_t m = c.pending_ratio[i];
      c.verify_bytes += static_cast<size_t>(m * ((n + m - 1) / m)) * c.pending_row_bytes[i];
    }
    // Saved ring slots: the target's n rows of every layer, the module's k feedback rows.
    c.verify_bytes += static_cast<size_t>(n * cfg.num_layers + speculative_tokens) * D * kF32;
  }
  for (const auto& [key, b] : entry) {
    const bool csa = key.first == static_cast<int>(AttnKind::CSA);
    c.kinds.push_back({std::string(csa ? "csa" : "hca") + "-entries/m" + std::to_string(key.second), key.second, b});
    if (csa) c.kinds.push_back({"csa-indexer-keys/m" + std::to_string(key.second), key.second, keys[key]});
  }
  return c;
}

size_t StateCosts::bytes_at(int64_t t) const {
  size_t n = window_bytes + mtp_bytes + verify_bytes;
  for (size_t i = 0; i < pending_ratio.size(); ++i)
    n += static_cast<size_t>(pending_rows(t, pending_ratio[i], pending_overlap[i])) * pending_row_bytes[i];
  for (const auto& k : kinds) n += static_cast<size_t>(t / k.ratio) * k.entry_bytes;
  return n;
}

double StateCosts::bytes_per_token() const {
  double b = 0;
  for (const auto& k : kinds) b += static_cast<double>(k.entry_bytes) / static_cast<double>(k.ratio);
  return b;
}

size_t parse_memory_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  std::string num = text.substr(0, i), unit = text.substr(i);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (unit.size() == 2 && unit[1] == 'I') unit.pop_back();  // KiB/MiB/GiB/TiB
  double v = 0;
  try {
    size_t used = 0;
    v = std::stod(num, &used);
    if (used != num.size()) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    fail("memory size: not a number: '", text, "'");
  }
  double mul = 1;
  if (unit == "K") mul = 1024.0;
  else if (unit == "M") mul = 1024.0 * 1024;
  else if (unit == "G") mul = 1024.0 * 1024 * 1024;
  else if (unit == "T") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty()) fail("memory size: unknown unit in '", text, "' (use K, M, G, T, optionally with iB/B)");
  DSV4_CHECK(v * mul >= 1, "memory size: must be positive: '", text, "'");
  return static_cast<size_t>(v * mul);
}

size_t gpu_kv_budget(size_t total_bytes, size_t used_bytes, double utilization) {
  DSV4_CHECK(utilization > 0 && utilization <= 1, "--gpu-memory-utilization must be in (0, 1], got ", utilization);
  const double target = utilization * static_cast<double>(total_bytes);
  DSV4_CHECK(target > static_cast<double>(used_bytes), "--gpu-memory-utilization ", utilization, " leaves no memory for KV: ",
             format_bytes(target), " allowed, ", format_bytes(static_cast<double>(used_bytes)), " already used");
  return static_cast<size_t>(target) - used_bytes;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

KvBudget::KvBudget(StateCosts costs, size_t budget_bytes, int64_t page_entries)
    : costs_(std::move(costs)), budget_(budget_bytes), page_entries_(page_entries) {
  DSV4_CHECK(page_entries_ > 0, "kv budget: page_entries must be positive");
  DSV4_CHECK(budget_ >= bytes_for(1), "kv budget ", format_bytes(static_cast<double>(budget_)),
             " cannot hold one sequence (needs ", format_bytes(static_cast<double>(bytes_for(1))), ")");
}

size_t KvBudget::used() const {
  std::lock_guard<std::mutex> lk(mu_);
  return used_;
}

int64_t KvBudget::pages_for(size_t k, int64_t tokens) const {
  const int64_t entries = tokens / costs_.kinds[k].ratio;
  return (entries + page_entries_ - 1) / page_entries_;
}

size_t KvBudget::page_bytes(size_t k) const { return costs_.kinds[k].entry_bytes * static_cast<size_t>(page_entries_); }

size_t KvBudget::bytes_for(int64_t tokens) const {
  size_t b = costs_.fixed_bytes();
  for (size_t k = 0; k < costs_.kinds.size(); ++k) b += static_cast<size_t>(pages_for(k, tokens)) * page_bytes(k);
  return b;
}

bool KvBudget::reserve(Reservation& r, int64_t tokens) {
  if (r.active && tokens <= r.tokens) return true;
  size_t extra = r.active ? 0 : costs_.fixed_bytes();
  std::vector<int64_t> pages(costs_.kinds.size());
  for (size_t k = 0; k < costs_.kinds.size(); ++k) {
    pages[k] = pages_for(k, tokens);
    const int64_t have = r.active ? r.pages[k] : 0;
    extra += static_cast<size_t>(pages[k] - have) * page_bytes(k);
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (used_ + extra > budget_) return false;
  used_ += extra;
  r.pages = std::move(pages);
  r.bytes += extra;
  r.tokens = tokens;
  r.active = true;
  return true;
}

void KvBudget::release(Reservation& r) {
  if (!r.active) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    used_ -= r.bytes;
  }
  r = Reservation{};
}

int64_t KvBudget::max_tokens_one_sequence() const {
  int64_t lo = 1, hi = 1;  // bytes_for is monotone: grow, then bisect
  while (bytes_for(hi * 2) <= budget_ && hi < (int64_t{1} << 40)) hi *= 2;
  hi *= 2;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (bytes_for(mid) <= budget_ ? lo : hi) = mid;
  }
  return lo;
}

int64_t KvBudget::sequences_at(int64_t context) const {
  return static_cast<int64_t>(budget_ / bytes_for(context));
}

std::string KvBudget::summary(int64_t max_context) const {
  const int64_t n = sequences_at(max_context);
  return detail::concat("kv budget ", format_bytes(static_cast<double>(budget_)), ": ",
                        format_bytes(static_cast<double>(costs_.fixed_bytes())), " fixed/sequence + ",
                        format_bytes(costs_.bytes_per_token()), "/token; one sequence up to ", max_tokens_one_sequence(),
                        " tokens; ", n, " sequences at max context ", max_context, " (", n * max_context, " tokens)");
}

}  // namespace dsv4
