#include "manifest.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace dsv4::test {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) out.push_back(cur);
  return out;
}

std::vector<int64_t> int_list(const std::string& s) {  // "0-2,5" -> 0,1,2,5
  std::vector<int64_t> out;
  for (const auto& item : split(s, ',')) {
    auto dash = item.find('-');
    int64_t a = std::stoll(item.substr(0, dash));
    int64_t b = dash == std::string::npos ? a : std::stoll(item.substr(dash + 1));
    for (int64_t v = a; v <= b; ++v) out.push_back(v);
  }
  return out;
}

void expand(const std::string& name, const std::vector<std::pair<std::string, std::vector<int64_t>>>& vars,
            size_t k, const TensorInfo& proto, std::map<std::string, TensorInfo>& out) {
  if (k == vars.size()) {
    TensorInfo t = proto;
    t.name = name;
    if (!out.emplace(name, t).second) fail("manifest: duplicate tensor '", name, "'");
    return;
  }
  const std::string key = "{" + vars[k].first + "}";
  auto pos = name.find(key);
  if (pos == std::string::npos) fail("manifest: '", name, "' lacks ", key);
  for (int64_t v : vars[k].second) {
    std::string n = name;
    n.replace(pos, key.size(), std::to_string(v));
    expand(n, vars, k + 1, proto, out);
  }
}

}  // namespace

std::map<std::string, TensorInfo> load_manifest(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open");
  std::map<std::string, TensorInfo> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    auto cols = split(line, '\t');
    if (cols.size() != 4) fail(path, ": bad row '", line, "'");
    TensorInfo proto;
    proto.dtype = dtype_from_name(cols[1]);
    proto.shape = int_list(cols[2]);
    if (cols[2].find('-') != std::string::npos) fail(path, ": bad shape in '", line, "'");
    std::vector<std::pair<std::string, std::vector<int64_t>>> vars;
    if (cols[3] != "-")
      for (const auto& part : split(cols[3], ';')) {
        auto eq = part.find('=');
        vars.emplace_back(part.substr(0, eq), int_list(part.substr(eq + 1)));
      }
    expand(cols[0], vars, 0, proto, out);
  }
  return out;
}

}  // namespace dsv4::test
