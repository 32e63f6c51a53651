#include "model/cuda/op_profile.h"

#include <algorithm>
#include <cstdio>

#include "backend/cuda/check.h"

namespace dsv4 {

OpProfile::~OpProfile() {
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);
}

cudaEvent_t OpProfile::event() {
  if (used_ == pool_.size()) {
    cudaEvent_t e;
    DSV4_CUDA_CHECK(cudaEventCreate(&e));
    pool_.push_back(e);
  }
  return pool_[used_++];
}

void OpProfile::begin(cudaStream_t s) {
  used_ = 0;
  names_.clear();
  DSV4_CUDA_CHECK(cudaEventRecord(event(), s));
}

void OpProfile::mark(const std::string& op, cudaStream_t s) {
  DSV4_CUDA_CHECK(cudaEventRecord(event(), s));
  names_.push_back(op);
}

void OpProfile::end() {
  if (used_ == 0) return;
  DSV4_CUDA_CHECK(cudaEventSynchronize(pool_[used_ - 1]));
  for (size_t i = 0; i + 1 < used_; ++i) {
    float ms = 0;
    DSV4_CUDA_CHECK(cudaEventElapsedTime(&ms, pool_[i], pool_[i + 1]));
    auto& t = totals_[names_[i]];
    t.first += ms;
    ++t.second;
  }
  ++calls_;
  used_ = 0;
  names_.clear();
}

void OpProfile::host_phase(const std::string& phase, double ms) {
  for (auto& [name, total] : host_)
    if (name == phase) {
      total += ms;
      return;
    }
  host_.emplace_back(phase, ms);
}

void OpProfile::reset() {
  totals_.clear();
  host_.clear();
  calls_ = 0;
}

std::string OpProfile::report() const {
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  double sum = 0;
  for (const auto& r : rows) sum += r.second.first;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "  %-28s %10s %8s %12s %7s\n", "op", "total ms", "marks", "us per call", "share");
  out += line;
  for (const auto& [name, t] : rows) {
    std::snprintf(line, sizeof line, "  %-28s %10.3f %8lld %12.1f %6.1f%%\n", name.c_str(), t.first,
                  static_cast<long long>(t.second), calls_ ? 1e3 * t.first / calls_ : 0.0,
                  sum > 0 ? 100.0 * t.first / sum : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-28s %10.3f %8s %12.1f\n", "sum", sum, "", calls_ ? 1e3 * sum / calls_ : 0.0);
  out += line;
  for (const auto& [phase, ms] : host_) {
    std::snprintf(line, sizeof line, "  host: %-40s %10.3f ms\n", phase.c_str(), ms);
    out += line;
  }
  return out;
}

}  // namespace dsv4
