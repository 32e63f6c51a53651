// Server-sent-events framing (serving.md §5.3): one `data: <single-line JSON>` event per
// chunk, a blank line after each, `data: [DONE]` at the end, `:` comment lines as
// keep-alives (clients ignore them; the write tells us when a client has gone).
#pragma once
#include <string>

#include "chat/json_dumps.h"

namespace dsv4 {

// Compact one-line JSON; invalid UTF-8 (never expected) is replaced rather than thrown.
std::string compact_json(const ojson& v);
std::string sse_event(const ojson& v);
inline std::string sse_done() { return "data: [DONE]\n\n"; }
inline std::string sse_keepalive() { return ": keep-alive\n\n"; }

}  // namespace dsv4
