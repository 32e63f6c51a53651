#include "server/sse.h"

namespace dsv4 {

std::string compact_json(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); }

std::string sse_event(const ojson& v) { return "data: " + compact_json(v) + "\n\n"; }

}  // namespace dsv4
