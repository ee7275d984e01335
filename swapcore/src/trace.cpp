// The one tracer: a timeline of layers, waits, reads and memory, written as a Chrome trace.
//
// Note [Tracing]
// ~~~~~~~~~~~~~~
// Where an inference's time goes on slow storage -- which layer ran while the disk idled, and
// what held the next read back -- was found more than once with temporary instrumentation
// (docs/executor.md). This is that instrumentation, kept: the executor records its layers,
// its waits for reads and why a read could not be issued; the block reader each request from
// issue to landing and the disk's busy periods; the Runtime its budget changes. A tool reads
// the file (bench/trace_summary.py: the disk's idle time per inference and the layers it idled
// under), a person opens it in ui.perfetto.dev.
//
// Policies:
//  - Off by default; `tracing()` is one relaxed atomic load, so call sites test it before they
//    read a clock.
//  - No allocation while recording: events are fixed-size records with string-literal names,
//    stored in a buffer reserved by trace_start(). The executor's thread is metered by the CPU
//    meter, whose bytes are the inference's activations; a trace must not change them. Events
//    past the buffer are counted (`dropped_events` in the file) rather than grown into.
//  - One mutex: events come from the executing threads and the reader threads; a few hundred
//    per inference, so it is not contended enough to matter next to a layer.
//  - Times are steady_clock, written in microseconds from trace_start().
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "swapnet/swapcore.h"

namespace swapnet {
namespace {

struct Event {
  std::int64_t t0 = 0, t1 = 0;  // ns from the origin
  const char* name = nullptr;
  const char* arg = nullptr;
  std::int64_t num = -1, value = 0;
  std::uint32_t group = 0;
  TraceLane lane = TraceLane::kCompute;
  char ph = 'X';  // X span, i instant, C counter
};

struct Tracer {
  std::mutex mu;
  std::vector<Event> events;  // reserved by trace_start: never reallocated while recording
  std::size_t cap = 0;
  std::uint64_t dropped = 0;
  TraceClock::time_point origin;
  std::vector<std::string> groups{"application"};
};

Tracer& tracer() {
  static Tracer* t = new Tracer();  // never destroyed: usable from static destructors
  return *t;
}

std::atomic<bool>& on() {
  static std::atomic<bool> v{false};
  return v;
}

std::int64_t ns(TraceClock::time_point t, TraceClock::time_point origin) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin).count();
}

void record(Event e, TraceClock::time_point t0, TraceClock::time_point t1) noexcept {
  Tracer& t = tracer();
  std::lock_guard<std::mutex> lock(t.mu);
  if (!on().load(std::memory_order_relaxed)) return;
  if (t.events.size() >= t.cap) {
    ++t.dropped;
    return;
  }
  // A span that began before trace_start() (a read issued before it) starts at the origin.
  e.t0 = std::max<std::int64_t>(0, ns(t0, t.origin));
  e.t1 = std::max(e.t0, ns(t1, t.origin));
  t.events.push_back(e);
}

const char* lane_name(TraceLane l) {
  switch (l) {
    case TraceLane::kInference: return "inference";
    case TraceLane::kCompute: return "compute";
    case TraceLane::kWait: return "wait for reads";
    case TraceLane::kCursor: return "read cursor";
    case TraceLane::kDisk: return "disk busy";
    case TraceLane::kReads: return "reads";
    case TraceLane::kControl: return "control";
  }
  return "?";
}
constexpr int kLanes = 7;

// JSON string contents: quotes, backslashes and control characters escaped.
std::string escaped(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o;
}

// What trace_write takes from the tracer, which stops recording.
struct Taken {
  std::vector<Event> events;
  std::vector<std::string> groups;
  std::uint64_t dropped = 0;
};

Taken take_events() {
  Tracer& t = tracer();
  Taken out;
  std::lock_guard<std::mutex> lock(t.mu);
  on().store(false);
  out.events.swap(t.events);
  out.groups = t.groups;
  out.dropped = t.dropped;
  t.cap = 0;
  return out;
}

// The file's list of trace events, written one at a time with separators between them.
struct EventList {
  std::FILE* f;
  bool first = true;
  void sep() {
    if (!first) std::fputs(",\n", f);
    first = false;
  }
};

// A process for each group that has events, with its lanes as named, ordered threads.
void write_names(EventList& out, const std::vector<std::string>& groups, const std::vector<Event>& events) {
  std::FILE* f = out.f;
  std::vector<char> used(groups.size(), 0);
  for (const Event& e : events) {
    if (e.group < used.size()) used[e.group] = 1;
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (!used[g]) continue;
    out.sep();
    std::fprintf(f, "{\"ph\":\"M\",\"pid\":%zu,\"name\":\"process_name\",\"args\":{\"name\":\"%s\"}}", g,
                 escaped(groups[g]).c_str());
    for (int l = 0; l < kLanes; ++l) {
      out.sep();
      std::fprintf(f, "{\"ph\":\"M\",\"pid\":%zu,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"%s\"}}", g,
                   l + 1, lane_name(static_cast<TraceLane>(l)));
      out.sep();
      std::fprintf(f, "{\"ph\":\"M\",\"pid\":%zu,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}}",
                   g, l + 1, l);
    }
  }
}

// One event: a counter, an instant, an async slice pair on the reads lane (they overlap; `id`
// numbers them), or a complete span.
void write_event(EventList& out, const Event& e, std::uint64_t* id) {
  std::FILE* f = out.f;
  const int tid = static_cast<int>(e.lane) + 1;
  char name[160];
  if (e.num >= 0) {
    std::snprintf(name, sizeof name, "%s %lld", e.name, static_cast<long long>(e.num));
  } else {
    std::snprintf(name, sizeof name, "%s", e.name);
  }
  char args[160] = "{}";
  if (e.ph == 'C') {
    std::snprintf(args, sizeof args, "{\"value\":%lld}", static_cast<long long>(e.value));
  } else if (e.arg != nullptr) {
    std::snprintf(args, sizeof args, "{\"%s\":%lld}", e.arg, static_cast<long long>(e.value));
  }
  const double ts = static_cast<double>(e.t0) / 1e3, te = static_cast<double>(e.t1) / 1e3;
  out.sep();
  if (e.ph == 'C') {
    std::fprintf(f, "{\"ph\":\"C\",\"pid\":%u,\"ts\":%.3f,\"name\":\"%s\",\"args\":%s}", e.group, ts, name, args);
  } else if (e.ph == 'i') {
    std::fprintf(f, "{\"ph\":\"i\",\"s\":\"t\",\"pid\":%u,\"tid\":%d,\"ts\":%.3f,\"name\":\"%s\",\"args\":%s}", e.group,
                 tid, ts, name, args);
  } else if (e.lane == TraceLane::kReads) {  // overlapping: an async slice each
    ++*id;
    std::fprintf(f,
                 "{\"ph\":\"b\",\"cat\":\"reads\",\"id\":%llu,\"pid\":%u,\"tid\":%d,\"ts\":%.3f,\"name\":\"%s\",\"args\":%s},\n"
                 "{\"ph\":\"e\",\"cat\":\"reads\",\"id\":%llu,\"pid\":%u,\"tid\":%d,\"ts\":%.3f,\"name\":\"%s\"}",
                 static_cast<unsigned long long>(*id), e.group, tid, ts, name, args,
                 static_cast<unsigned long long>(*id), e.group, tid, te, name);
  } else {
    std::fprintf(f, "{\"ph\":\"X\",\"pid\":%u,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"name\":\"%s\",\"args\":%s}", e.group,
                 tid, ts, te - ts, name, args);
  }
}

// Closes the trace file; an error while writing or closing it fails the write.
Status close_trace(std::FILE* f, const std::string& path) {
  errno = 0;
  const bool bad = std::ferror(f) != 0;
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  const int e = !closed && errno != 0 ? errno : write_errno != 0 ? write_errno : EIO;
  if (bad || !closed) {
    return Status::error(e, path + ": writing the trace failed: " + std::strerror(e) + " (" + errno_name(e) + ")");
  }
  return Status();
}

}  // namespace

void trace_start(std::size_t max_events) {
  Tracer& t = tracer();
  std::lock_guard<std::mutex> lock(t.mu);
  t.events.clear();
  t.events.shrink_to_fit();
  t.events.reserve(max_events);
  t.cap = max_events;
  t.dropped = 0;
  t.origin = TraceClock::now();
  on().store(true);
}

bool tracing() noexcept { return on().load(std::memory_order_relaxed); }

std::uint32_t trace_group(const std::string& name) {
  Tracer& t = tracer();
  std::lock_guard<std::mutex> lock(t.mu);
  t.groups.push_back(name);
  return static_cast<std::uint32_t>(t.groups.size() - 1);
}

void trace_span(std::uint32_t group, TraceLane lane, const char* name, std::int64_t num, TraceClock::time_point begin,
                TraceClock::time_point end, const char* arg, std::int64_t value) noexcept {
  // A begin never set (taken while tracing was off): no span.
  if (tracing() && begin != TraceClock::time_point{}) record(Event{0, 0, name, arg, num, value, group, lane, 'X'}, begin, end);
}

void trace_instant(std::uint32_t group, TraceLane lane, const char* name, std::int64_t num, const char* arg,
                   std::int64_t value) noexcept {
  if (!tracing()) return;
  const auto now = TraceClock::now();
  record(Event{0, 0, name, arg, num, value, group, lane, 'i'}, now, now);
}

void trace_counter(std::uint32_t group, const char* name, std::int64_t value) noexcept {
  if (!tracing()) return;
  const auto now = TraceClock::now();
  record(Event{0, 0, name, nullptr, -1, value, group, TraceLane::kCompute, 'C'}, now, now);
}

Status trace_write(const std::string& path) {
  const Taken taken = take_events();
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    const int e = errno;
    return Status::error(e, path + ": cannot write the trace: " + std::strerror(e) + " (" + errno_name(e) + ")");
  }
  std::fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_events\":%llu,\"events\":%zu},\"traceEvents\":[\n",
               static_cast<unsigned long long>(taken.dropped), taken.events.size());
  EventList out{f};
  write_names(out, taken.groups, taken.events);
  std::uint64_t id = 0;
  for (const Event& e : taken.events) write_event(out, e, &id);
  std::fputs("\n]}\n", f);
  return close_trace(f, path);
}

}  // namespace swapnet
