#include "chat/stream_parser.h"

#include <cstring>

#include "chat/json_dumps.h"
#include "chat/utf8.h"

namespace dsv4 {

namespace {

const std::string kEos = dsml::kEos;
const std::string kBos = dsml::kBos;
const std::string kThinkOpen = dsml::kThinkOpen;
const std::string kThinkClose = dsml::kThinkClose;
const std::string kDsmlOpen = "<｜DSML｜";
const std::string kDsmlClose = "</｜DSML｜";
const std::string kDsmlBare = dsml::kDsml;
const std::string kToolsEnd = "</｜DSML｜tool_calls>";
const std::string kInvokeName = "invoke name=\"";
const std::string kParamName = "parameter name=\"";
const std::string kTrue = "true\">";
const std::string kFalse = "false\">";

enum class Match { kNone, kPartial, kFull };

// Does `m` occur at s[i..]? kPartial: s ends inside a prefix of m.
Match match_at(std::string_view s, std::size_t i, const std::string& m) {
  const std::size_t avail = s.size() - i;
  if (avail >= m.size()) return std::memcmp(s.data() + i, m.data(), m.size()) == 0 ? Match::kFull : Match::kNone;
  return std::memcmp(s.data() + i, m.data(), avail) == 0 ? Match::kPartial : Match::kNone;
}

// Bytes at the end of `s` that start a UTF-8 character not yet complete.
std::size_t incomplete_tail(std::string_view s) {
  for (std::size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    const auto c = static_cast<unsigned char>(s[s.size() - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    if (c < 0x80) return 0;
    std::size_t sub;
    bool trunc;
    return (utf8_seq_len(s.substr(s.size() - k), &sub, &trunc) == 0 && trunc) ? k : 0;
  }
  return 0;
}

}  // namespace

StreamParser::StreamParser(StreamParserOptions opt)
    : opt_(std::move(opt)), state_(opt_.mode == ThinkingMode::kThinking ? State::kReasoning : State::kContent) {}

ParsedMessage StreamParser::parse(std::string_view text, const StreamParserOptions& opt) {
  StreamParser p(opt);
  std::vector<StreamEvent> ev;
  p.feed(text, ev);
  p.finish(ev);
  return p.result();
}

void StreamParser::feed(std::string_view chunk, std::vector<StreamEvent>& out) {
  buf_.append(chunk);
  run(false, out);
}

void StreamParser::finish(std::vector<StreamEvent>& out) {
  run(true, out);
  if (state_ != State::kFinished) close_open(out);
  // After the end only EOS may follow (unless a stop string cut the output).
  std::string_view rest = after_;
  if (rest.substr(0, kEos.size()) == kEos) rest.remove_prefix(kEos.size());
  if (!rest.empty() && !stop_hit_) ++anomalies_;
  after_.clear();
  state_ = State::kFinished;
}

// Output ended inside tool markup: close what is open so the arguments stay valid JSON.
void StreamParser::close_open(std::vector<StreamEvent>& out) {
  switch (state_) {
    case State::kToolName: ++anomalies_; break;  // no header was emitted: drop the call
    case State::kParamType:
      emit_args("null", out);
      [[fallthrough]];
    case State::kArgs:
    case State::kParamName:
    case State::kRawValue:
      ++anomalies_;
      close_call(true, out);
      break;
    case State::kStringValue:
      ++anomalies_;
      emit_args("\"", out);
      close_call(true, out);
      break;
    case State::kRawBody:
      ++anomalies_;
      close_call(false, out);
      break;
    case State::kToolCalls: ++anomalies_; break;  // block never closed
    default: break;
  }
  state_ = State::kFinished;
}

void StreamParser::run(bool eof, std::vector<StreamEvent>& out) {
  for (;;) {
    if (state_ == State::kFinished) {
      // Keep a little of what follows the end, to tell a trailing EOS from junk.
      if (after_.size() < 64) after_.append(buf_.substr(0, 64 - after_.size()));
      buf_.clear();
      return;
    }
    const std::size_t limit = eof ? buf_.size() : buf_.size() - incomplete_tail(buf_);
    const bool progressed = (state_ == State::kReasoning || state_ == State::kContent) ? step_text(eof, limit, out)
                                                                                        : step_tool(eof, limit, out);
    if (!progressed) return;
  }
}

void StreamParser::emit_text(std::string_view s, std::vector<StreamEvent>& out) {
  if (s.empty()) return;
  const bool reasoning = state_ == State::kReasoning;
  (reasoning ? msg_.reasoning_content : msg_.content).append(s);
  const auto kind = reasoning ? StreamEvent::Kind::kReasoning : StreamEvent::Kind::kContent;
  if (!out.empty() && out.back().kind == kind)
    out.back().text.append(s);
  else
    out.push_back({kind, -1, std::string(s)});
}

void StreamParser::emit_args(std::string_view s, std::vector<StreamEvent>& out) {
  if (s.empty() || call_ < 0) return;
  msg_.tool_calls[call_].arguments.append(s);
  if (!out.empty() && out.back().kind == StreamEvent::Kind::kToolCallArgs && out.back().index == call_)
    out.back().text.append(s);
  else
    out.push_back({StreamEvent::Kind::kToolCallArgs, call_, std::string(s)});
}

void StreamParser::close_call(bool add_brace, std::vector<StreamEvent>& out) {
  if (add_brace) emit_args(first_param_ ? "{}" : "}", out);
  out.push_back({StreamEvent::Kind::kToolCallEnd, call_, ""});
  state_ = State::kToolCalls;
}

// Reasoning / Content. Returns true when the state changed (the caller loops again).
bool StreamParser::step_text(bool eof, std::size_t limit, std::vector<StreamEvent>& out) {
  const std::string_view s(buf_.data(), limit);
  const bool content = state_ == State::kContent;
  std::string text;  // batched output
  std::size_t i = 0, hold = limit;
  auto change = [&](State to, std::size_t consumed) {
    emit_text(text, out);
    buf_.erase(0, consumed);
    state_ = to;
    leading_ = true;
    return true;
  };
  while (i < limit) {
    const char c = s[i];
    // Markers that may begin here (all but stop strings start with '<' or '｜').
    if (c == '<' || c == '\xEF' || (content && !opt_.stop.empty())) {
      bool partial = false;
      if (content) {
        for (const auto& st : opt_.stop) {
          if (st.empty()) continue;
          const Match m = match_at(s, i, st);
          if (m == Match::kFull) {
            stop_hit_ = true;
            emit_text(text, out);
            buf_.erase(0, i + st.size());
            state_ = State::kFinished;
            return true;
          }
          partial |= m == Match::kPartial;
        }
      }
      if (match_at(s, i, kEos) == Match::kFull) {
        emit_text(text, out);
        buf_.erase(0, i + kEos.size());
        state_ = State::kFinished;
        return true;
      }
      if (match_at(s, i, kDsmlOpen) == Match::kFull) return change(State::kToolCalls, i + kDsmlOpen.size());
      if (match_at(s, i, kThinkClose) == Match::kFull) {
        if (content) {  // stray end of thinking: drop it
          ++anomalies_;
          i += kThinkClose.size();
          continue;
        }
        return change(State::kContent, i + kThinkClose.size());
      }
      const std::string* dropped[] = {&kThinkOpen, &kBos, &kDsmlBare};
      bool skip = false;
      for (const std::string* d : dropped)
        if (match_at(s, i, *d) == Match::kFull) {
          ++anomalies_;
          i += d->size();
          skip = true;
          break;
        }
      if (skip) continue;
      bool marker_partial = false;
      for (const std::string* m : {&kEos, &kDsmlOpen, &kThinkClose, &kThinkOpen, &kBos, &kDsmlBare})
        marker_partial |= match_at(s, i, *m) == Match::kPartial;
      if ((partial || marker_partial) && !eof) {
        hold = i;
        break;
      }
      // Output cut inside a special marker (it already shows a '｜' byte): drop the stub.
      if (marker_partial && eof && s.substr(i).find('\xEF') != std::string_view::npos) {
        ++anomalies_;
        i = limit;
        break;
      }
    }
    if (c == '\n') {
      // A newline run may be the prefix of "\n*</think>" or "\n*<｜DSML｜".
      std::size_t j = i;
      while (j < limit && s[j] == '\n') ++j;
      const Match mt = j < limit ? match_at(s, j, kThinkClose) : Match::kPartial;
      const Match md = j < limit ? match_at(s, j, kDsmlOpen) : Match::kPartial;
      const std::size_t k = j - i;
      if (md == Match::kFull) {
        // raw mode keeps all but the "\n\n" that belongs to the tool-block opener
        if (!opt_.strip_newlines && k > 2) text.append(k - 2, '\n');
        return change(State::kToolCalls, j + kDsmlOpen.size());
      }
      if (mt == Match::kFull && !content) {
        if (!opt_.strip_newlines) text.append(k, '\n');
        return change(State::kContent, j + kThinkClose.size());
      }
      if ((mt == Match::kPartial || md == Match::kPartial) && !eof) {
        hold = i;
        break;
      }
      // Ordinary newlines (one at a time when a stop string could start inside the run).
      const std::size_t take = (content && !opt_.stop.empty()) ? 1 : k;
      if (!(leading_ && opt_.strip_newlines)) text.append(take, '\n');
      i += take;
      continue;
    }
    text.push_back(c);
    leading_ = false;
    ++i;
  }
  emit_text(text, out);
  buf_.erase(0, hold);
  return false;
}

// Tool-call states: each waits for its markers and skips, collects or emits what is between.
bool StreamParser::step_tool(bool eof, std::size_t limit, std::vector<StreamEvent>& out) {
  const std::string_view s(buf_.data(), limit);
  std::size_t i = 0, hold = limit;
  std::string emit;  // argument text to emit (values)
  auto go = [&](State to, std::size_t consumed) {
    emit_args(emit, out);
    buf_.erase(0, consumed);
    state_ = to;
    return true;
  };
  while (i < limit) {
    // EOS ends the output in every tool state.
    const Match me = match_at(s, i, kEos);
    if (me == Match::kFull) {
      emit_args(emit, out);
      buf_.erase(0, i + kEos.size());
      close_open(out);  // EOS inside the block: close what is open
      return true;
    }
    bool partial = me == Match::kPartial;
    switch (state_) {
      case State::kToolCalls: {
        if (match_at(s, i, kInvokeName) == Match::kFull) {
          acc_.clear();
          return go(State::kToolName, i + kInvokeName.size());
        }
        if (match_at(s, i, kToolsEnd) == Match::kFull) {
          buf_.erase(0, i + kToolsEnd.size());
          state_ = State::kFinished;
          after_.clear();
          return true;
        }
        partial |= match_at(s, i, kInvokeName) == Match::kPartial || match_at(s, i, kToolsEnd) == Match::kPartial;
        break;
      }
      case State::kToolName:
      case State::kParamName: {
        if (s[i] == '"') {
          if (state_ == State::kToolName) {
            msg_.tool_calls.push_back({acc_, ""});
            out.push_back({StreamEvent::Kind::kToolCallBegin, ++call_, acc_});
            first_param_ = true;
            return go(State::kArgs, i + 1);
          }
          std::string frag = first_param_ ? "{\"" : ", \"";
          json_escape_append(acc_, frag);
          frag += "\": ";
          first_param_ = false;
          emit += frag;
          return go(State::kParamType, i + 1);
        }
        if (partial && !eof) {  // maybe the start of EOS: decide when more arrives
          hold = i;
          i = limit;
          continue;
        }
        acc_.push_back(s[i]);
        ++i;
        continue;
      }
      case State::kArgs: {
        if (match_at(s, i, kParamName) == Match::kFull) {
          acc_.clear();
          return go(State::kParamName, i + kParamName.size());
        }
        if (match_at(s, i, kDsmlClose) == Match::kFull) {
          buf_.erase(0, i + kDsmlClose.size());
          close_call(true, out);
          return true;
        }
        if (first_param_ && s[i] == '{') return go(State::kRawBody, i);  // JSON-object invoke body
        partial |= match_at(s, i, kParamName) == Match::kPartial || match_at(s, i, kDsmlClose) == Match::kPartial;
        break;
      }
      case State::kParamType: {
        if (match_at(s, i, kTrue) == Match::kFull) {
          emit += "\"";
          return go(State::kStringValue, i + kTrue.size());
        }
        if (match_at(s, i, kFalse) == Match::kFull) return go(State::kRawValue, i + kFalse.size());
        partial |= match_at(s, i, kTrue) == Match::kPartial || match_at(s, i, kFalse) == Match::kPartial;
        break;
      }
      case State::kStringValue:
      case State::kRawValue:
      case State::kRawBody: {
        const Match mc = match_at(s, i, kDsmlClose);
        if (mc == Match::kFull) {
          if (state_ == State::kStringValue) emit += "\"";
          if (state_ == State::kRawBody) {
            emit_args(emit, out);
            buf_.erase(0, i + kDsmlClose.size());
            close_call(false, out);
            return true;
          }
          return go(State::kArgs, i + kDsmlClose.size());
        }
        if ((mc == Match::kPartial || partial) && !eof) {
          hold = i;
          i = limit;
          continue;
        }
        if (mc == Match::kPartial && eof) {  // cut inside the closing tag: not part of the value
          i = limit;
          continue;
        }
        if (state_ == State::kStringValue)
          json_escape_append(std::string_view(&s[i], 1), emit);
        else
          emit.push_back(s[i]);
        ++i;
        continue;
      }
      default: return false;
    }
    if (partial && !eof) {
      hold = i;
      break;
    }
    ++i;  // skipped text
  }
  emit_args(emit, out);
  buf_.erase(0, hold);
  return false;
}

}  // namespace dsv4
