// Runs a fuzz target without libFuzzer (for ctest, any compiler): the seed files given on
// the command line, then deterministic mutations of them.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  std::vector<std::string> seeds;
  int iters = 3000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--iters=", 0) == 0) {
      iters = std::stoi(a.substr(8));
      continue;
    }
    std::ifstream f(a, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    seeds.push_back(ss.str());
  }
  if (seeds.empty()) seeds.push_back("seed");
  std::mt19937 rng(1234);
  for (const auto& s : seeds) LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  for (int k = 0; k < iters; ++k) {
    std::string s = seeds[rng() % seeds.size()];
    const int edits = 1 + rng() % 8;
    for (int e = 0; e < edits; ++e) {
      const std::size_t pos = s.empty() ? 0 : rng() % s.size();
      switch (rng() % 4) {
        case 0: if (!s.empty()) s[pos] = static_cast<char>(rng()); break;
        case 1: s.insert(pos, 1, static_cast<char>(rng())); break;
        case 2: if (!s.empty()) s.erase(pos, 1 + rng() % 4); break;
        case 3: { const auto& o = seeds[rng() % seeds.size()]; if (!o.empty()) { const std::size_t a = rng() % o.size(); s.insert(pos, o.substr(a, 1 + rng() % 16)); } break; }
      }
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  std::printf("%zu seeds + %d mutations: ok\n", seeds.size(), iters);
  return 0;
}
