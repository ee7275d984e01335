// Scenario files (scenario.h).
#include "scenario.h"

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>

#include "swapnet/swapcore.h"

namespace swapnet {
namespace cli {

namespace {

using json = nlohmann::json;

bool exists(const std::string& p) {
  struct stat sb;
  return ::stat(p.c_str(), &sb) == 0;
}

// Throws unless every key of object `e` (at `at`, "" for the top level) is in `keys`; the error
// names the field and ends with `what` (e.g. " is not a model field").
void only_keys(const json& e, const std::string& path, const std::string& at, const std::set<std::string>& keys,
               const std::string& what) {
  for (const auto& [k, v] : e.items()) {
    if (!keys.count(k)) throw Error(path + ": field '" + (at.empty() ? k : at + "." + k) + "'" + what);
  }
}

// The scenario file being read: names its fields in errors.
struct Fields {
  const std::string& path;

  std::string field(const std::string& where) const { return path + ": field '" + where + "'"; }

  // An integer within [lo, hi]: a fraction, a number out of range (JSON reads 1e20 as a float,
  // which no int holds) or anything else is refused, naming the field, the value and the range.
  long long integer(const json& v, const std::string& where, long long lo, long long hi) const {
    // An unsigned beyond `hi` (up to 2^64 - 1) would wrap as long long: compared unsigned first.
    const bool whole = v.is_number_integer() &&
                       (!v.is_number_unsigned() || v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi));
    if (!whole || v.get<long long>() < lo || v.get<long long>() > hi) {
      throw Error(field(where) + ": " + v.dump() + " is not an integer in " + std::to_string(lo) + ".." +
                  std::to_string(hi));
    }
    return v.get<long long>();
  }
};

json parse_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(path + ": cannot open the scenario file");
  json j;
  try {
    j = json::parse(f);
  } catch (const std::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  return j;
}

// A number field of the top level within [lo, hi], or `fallback` when absent.
double number(const json& j, const Fields& f, const char* name, double lo, double hi, double fallback) {
  if (!j.contains(name)) return fallback;
  const json& v = j[name];
  if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi)) {
    throw Error(f.field(name) + ": " + v.dump() + " must be a number in [" + json(lo).dump() + ", " + json(hi).dump() + "]");
  }
  return v.get<double>();
}

// The load and the run rules (Note [Load and run rules] in serve_load.cpp).
void read_run_rules(const json& j, const Fields& f, Scenario* s) {
  s->load = number(j, f, "load", 0.01, 10, 0);
  s->warmup_s = number(j, f, "warmup_s", 0, 3600, -1);
  if (j.contains("min_requests")) s->min_requests = static_cast<int>(f.integer(j["min_requests"], "min_requests", 0, 1000000));
}

// The top level's own fields: name, total_budget, policy, scheduler, workers, duration_s, and
// the run rules.
void read_header(const json& j, const Fields& f, Scenario* s) {
  const std::string& path = f.path;
  if (!j.is_object()) throw Error(path + ": the scenario must be a JSON object");
  static const std::set<std::string> known = {"name",     "total_budget", "policy",    "duration_s", "models",
                                              "schedule", "description",  "scheduler", "workers",    "groups",
                                              "load",     "warmup_s",     "min_requests", "budget_trace"};
  only_keys(j, path, "", known,
            " is not a scenario field (name, description, total_budget, policy, scheduler, workers, duration_s, "
            "load, warmup_s, min_requests, models, groups, schedule, budget_trace)");
  try {
    s->name = j.value("name", std::string("scenario"));
    if (!j.contains("total_budget")) throw Error(f.field("total_budget") + " is missing");
    const json& t = j["total_budget"];
    if (!t.is_number_unsigned() && !t.is_string()) {
      throw Error(f.field("total_budget") + " must be a size (\"843MiB\", bytes) or a percentage (\"72.6%\")");
    }
    s->total = t.is_number() ? std::to_string(t.get<std::uint64_t>()) : t.get<std::string>();
    s->policy = j.value("policy", s->policy);
    s->scheduler = j.value("scheduler", s->scheduler);
    if (j.contains("workers")) s->workers = static_cast<int>(f.integer(j["workers"], "workers", 1, 1024));
    s->duration_s = j.value("duration_s", s->duration_s);
    read_run_rules(j, f, s);
  } catch (const json::exception& e) {
    throw Error(path + ": " + e.what());
  }
  if (!(s->duration_s > 0)) throw Error(f.field("duration_s") + ": " + std::to_string(s->duration_s) + " must be > 0");
}

// A relative image path looked up next to the scenario file (`dir`), then in `models_dir`.
std::string find_image(const std::string& image, const std::string& dir, const std::string& models_dir,
                       const Fields& f, const std::string& at) {
  if (image.empty() || image[0] == '/') return image;
  std::string found;
  for (const std::string& d : {dir, models_dir}) {
    if (found.empty() && exists(d + "/" + image)) found = d + "/" + image;
  }
  if (found.empty()) {
    throw Error(f.field(at + ".image") + ": '" + image + "' is neither in " + dir + " nor in " + models_dir +
                " (scripts/models.sh paper makes the paper's models; swapnet pack makes images)");
  }
  return found;
}

// A model's arrivals: rate_hz, period_ms, jitter_ms, slo_ms, and the checks between them.
void read_arrivals(const json& m, const Fields& f, const std::string& at, ScenarioModel* sm) {
  sm->rate_hz = m.value("rate_hz", 0.0);
  if (sm->rate_hz < 0) throw Error(f.field(at + ".rate_hz") + " must be >= 0 (0: closed loop)");
  sm->period_ms = m.value("period_ms", 0.0);
  sm->jitter_ms = m.value("jitter_ms", 0.0);
  sm->slo_ms = m.value("slo_ms", 0.0);
  if (sm->period_ms < 0) throw Error(f.field(at + ".period_ms") + " must be >= 0 (0: no open-loop arrivals)");
  if (sm->jitter_ms < 0 || (sm->period_ms > 0 && sm->jitter_ms >= sm->period_ms)) {
    throw Error(f.field(at + ".jitter_ms") + ": " + std::to_string(sm->jitter_ms) + " must be >= 0 and below period_ms");
  }
  if (sm->slo_ms < 0) throw Error(f.field(at + ".slo_ms") + " must be >= 0 (0: no deadline)");
  if (sm->period_ms > 0 && sm->rate_hz > 0) {
    throw Error(f.field(at + ".period_ms") + ": give period_ms or rate_hz, not both");
  }
}

// models[i] (`at`), checked; json errors come back naming it.
ScenarioModel read_model(const json& m, const Fields& f, const std::string& at, const std::string& dir,
                         const std::string& models_dir) {
  static const std::set<std::string> model_keys = {"name", "image", "urgency", "device", "threads", "cpus", "rate_hz",
                                                   "input_shape", "period_ms", "jitter_ms", "slo_ms"};
  if (!m.is_object()) throw Error(f.field(at) + " must be an object");
  only_keys(m, f.path, at, model_keys, " is not a model field");
  ScenarioModel sm;
  try {
    if (!m.contains("image")) throw Error(f.field(at + ".image") + " is missing");
    const std::string image = m["image"].get<std::string>();
    sm.rt.name = m.value("name", image.substr(image.rfind('/') + 1));
    sm.rt.image = find_image(image, dir, models_dir, f, at);
    sm.rt.urgency = m.value("urgency", 1.0);
    if (!(sm.rt.urgency > 0)) throw Error(f.field(at + ".urgency") + ": " + std::to_string(sm.rt.urgency) + " must be > 0");
    sm.device = m.value("device", std::string("cpu"));
    if (sm.device != "cpu" && sm.device != "cuda") {
      throw Error(f.field(at + ".device") + ": '" + sm.device + "' is not cpu or cuda");
    }
    sm.rt.options.device = sm.device == "cuda" ? ExecutorOptions::Device::kCUDA : ExecutorOptions::Device::kCPU;
    sm.rt.threads = m.contains("threads") ? static_cast<int>(f.integer(m["threads"], at + ".threads", 0, 1024)) : 0;
    if (m.contains("cpus")) {
      if (!m["cpus"].is_array()) throw Error(f.field(at + ".cpus") + " must be a list of CPU numbers");
      for (const json& c : m["cpus"]) sm.rt.cpus.push_back(static_cast<int>(f.integer(c, at + ".cpus", 0, 65535)));
    }
    read_arrivals(m, f, at, &sm);
    if (m.contains("input_shape")) {
      sm.shapes = m["input_shape"].is_string() ? std::vector<std::string>{m["input_shape"].get<std::string>()}
                                               : m["input_shape"].get<std::vector<std::string>>();
    }
  } catch (const json::exception& e) {
    throw Error(f.field(at) + ": " + e.what());
  }
  return sm;
}

void read_models(const json& j, const Fields& f, const std::string& models_dir, Scenario* s) {
  const std::string& path = f.path;
  if (!j.contains("models") || !j["models"].is_array() || j["models"].empty()) {
    throw Error(f.field("models") + " must be a non-empty array");
  }
  const std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  for (size_t i = 0; i < j["models"].size(); ++i) {
    const std::string at = "models[" + std::to_string(i) + "]";
    ScenarioModel sm = read_model(j["models"][i], f, at, dir, models_dir);
    for (const auto& other : s->models) {
      if (other.rt.name == sm.rt.name) throw Error(f.field(at + ".name") + ": '" + sm.rt.name + "' is used twice");
    }
    s->models.push_back(std::move(sm));
  }
}

// Makes the models `names` members of group `g` (`sg`, at `at`): each takes the group's deadline.
void join_group(const std::vector<std::string>& names, const Fields& f, const std::string& at, size_t g,
                ScenarioGroup* sg, Scenario* s) {
  for (const auto& name : names) {
    int found = -1;
    for (size_t i = 0; i < s->models.size(); ++i) {
      if (s->models[i].rt.name == name) found = static_cast<int>(i);
    }
    if (found < 0) throw Error(f.field(at + ".models") + ": '" + name + "' is not a model of the scenario");
    ScenarioModel& m = s->models[static_cast<size_t>(found)];
    if (m.group == static_cast<int>(g)) throw Error(f.field(at + ".models") + ": '" + name + "' is listed twice");
    if (m.group >= 0) {
      throw Error(f.field(at + ".models") + ": '" + name + "' is already in group '" +
                  s->groups[static_cast<size_t>(m.group)].name + "'");
    }
    if (m.period_ms > 0 || m.rate_hz > 0 || m.slo_ms > 0) {
      throw Error(f.field(at + ".models") + ": '" + name +
                  "' has its own period_ms, rate_hz or slo_ms; a group member takes the group's");
    }
    m.group = static_cast<int>(g);
    m.slo_ms = sg->slo_ms;
    sg->members.push_back(found);
  }
}

// groups[g], checked against the models read so far (which it marks as its members).
ScenarioGroup read_group(const json& e, const Fields& f, size_t g, Scenario* s) {
  static const std::set<std::string> group_keys = {"name", "models", "period_ms", "jitter_ms", "slo_ms"};
  const std::string at = "groups[" + std::to_string(g) + "]";
  if (!e.is_object()) throw Error(f.field(at) + " must be an object");
  only_keys(e, f.path, at, group_keys, " is not a group field (name, models, period_ms, jitter_ms, slo_ms)");
  ScenarioGroup sg;
  try {
    sg.name = e.value("name", "group" + std::to_string(g));
    if (!e.contains("period_ms") || !e["period_ms"].is_number() || !(e["period_ms"].get<double>() > 0)) {
      throw Error(f.field(at + ".period_ms") + " must be a number > 0 (the group's frames arrive at that period)");
    }
    sg.period_ms = e["period_ms"].get<double>();
    sg.jitter_ms = e.value("jitter_ms", 0.0);
    sg.slo_ms = e.value("slo_ms", sg.period_ms);
    if (sg.jitter_ms < 0 || sg.jitter_ms >= sg.period_ms) {
      throw Error(f.field(at + ".jitter_ms") + ": " + std::to_string(sg.jitter_ms) + " must be >= 0 and below period_ms");
    }
    if (!(sg.slo_ms > 0)) throw Error(f.field(at + ".slo_ms") + " must be > 0 (default: period_ms)");
    if (!e.contains("models") || !e["models"].is_array() || e["models"].empty()) {
      throw Error(f.field(at + ".models") + " must be a non-empty array of model names");
    }
    join_group(e["models"].get<std::vector<std::string>>(), f, at, g, &sg, s);
  } catch (const json::exception& x) {
    throw Error(f.field(at) + ": " + x.what());
  }
  for (const auto& other : s->groups) {
    if (other.name == sg.name) throw Error(f.field(at + ".name") + ": '" + sg.name + "' is used twice");
  }
  return sg;
}

void read_groups(const json& j, const Fields& f, Scenario* s) {
  if (!j.contains("groups")) return;
  if (!j["groups"].is_array()) throw Error(f.field("groups") + " must be an array of {name, models, period_ms}");
  for (size_t g = 0; g < j["groups"].size(); ++g) s->groups.push_back(read_group(j["groups"][g], f, g, s));
}

void read_schedule(const json& j, const Fields& f, Scenario* s) {
  if (!j.contains("schedule")) return;
  if (!j["schedule"].is_array()) throw Error(f.field("schedule") + " must be an array of {at_s, budget}");
  for (size_t i = 0; i < j["schedule"].size(); ++i) {
    const json& e = j["schedule"][i];
    const std::string at = "schedule[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("at_s") || !e.contains("budget") || !e["at_s"].is_number() ||
        !(e["budget"].is_string() || e["budget"].is_number_unsigned())) {
      throw Error(f.field(at) + " must be {\"at_s\": SECONDS, \"budget\": SIZE}");
    }
    s->schedule.emplace_back(e["at_s"].get<double>(), e["budget"].is_number()
                                                          ? std::to_string(e["budget"].get<std::uint64_t>())
                                                          : e["budget"].get<std::string>());
  }
}

// Note [Budget traces]
// ~~~~~~~~~~~~~~~~~~~~
// Besides "schedule" (budget steps at given times), "budget_trace" makes one: a sawtooth
// {"sawtooth": {"high": "80%", "low": "50%", "period_s": 10, "steps": 5}} starts each period at
// `high` and cuts it in `steps` equal steps down to `low` (memory pressure building up, then
// released), for four times the longer of the duration and 600 s (a run may be given a
// longer --duration, or go on past it for min_requests); a
// replay {"replay": "pressure.csv"} takes the budget at each time from a file of "t_s,budget"
// lines (a header line allowed; budgets as in total_budget; a relative path is next to the
// scenario), e.g. recorded from /proc/meminfo on a device.
constexpr size_t kMaxTraceSteps = 100000;

void read_sawtooth(const json& t, const Fields& f, Scenario* s) {
  const std::string at = "budget_trace.sawtooth";
  if (!t.is_object() || !t.contains("high") || !t.contains("low") || !t.contains("period_s") ||
      !t["high"].is_string() || !t["low"].is_string() || !t["period_s"].is_number() || !(t["period_s"].get<double>() > 0)) {
    throw Error(f.field(at) + " must be {\"high\": BUDGET, \"low\": BUDGET, \"period_s\": S > 0, \"steps\": N}");
  }
  const int steps = t.contains("steps") ? static_cast<int>(f.integer(t["steps"], at + ".steps", 1, 1000)) : 4;
  const double period = t["period_s"].get<double>();
  const double horizon = 4 * std::max(s->duration_s, 600.0);  // --duration may be longer
  if (period < 0.1 || horizon / period * (steps + 1) > kMaxTraceSteps) {
    throw Error(f.field(at + ".period_s") + ": " + std::to_string(period) + " s with " + std::to_string(steps) +
                " steps makes more than " + std::to_string(kMaxTraceSteps) + " budget changes (or is below 0.1 s)");
  }
  const std::string high = t["high"].get<std::string>(), low = t["low"].get<std::string>();
  for (double p0 = 0; p0 < horizon; p0 += period) {
    for (int k = 0; k <= steps; ++k) {
      // Step k of `steps`: the fraction k/steps of the way from high to low, as a blend the
      // runtime resolves ("high~low@x", see budget_value).
      s->schedule.emplace_back(p0 + period * k / (steps + 1), k == 0 ? high : high + "~" + low + "@" + std::to_string(double(k) / steps));
    }
  }
}

void read_replay(const json& t, const Fields& f, Scenario* s) {
  if (!t.is_string()) throw Error(f.field("budget_trace.replay") + " must be a file name");
  std::string file = t.get<std::string>();
  if (!file.empty() && file[0] != '/') {
    const size_t slash = f.path.rfind('/');
    file = (slash == std::string::npos ? std::string(".") : f.path.substr(0, slash)) + "/" + file;
  }
  std::ifstream in(file);
  if (!in) throw Error(f.field("budget_trace.replay") + ": cannot read " + file);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const size_t comma = line.find(',');
    if (line.empty() || (n == 1 && !line.empty() && !std::isdigit(static_cast<unsigned char>(line[0])))) continue;
    double t_s = -1;
    try {
      t_s = comma == std::string::npos ? -1 : std::stod(line.substr(0, comma));
    } catch (...) {
    }
    if (!(t_s >= 0)) {
      throw Error(f.field("budget_trace.replay") + ": " + file + ":" + std::to_string(n) + ": '" + line +
                  "' is not \"t_s,budget\" with t_s >= 0");
    }
    if (s->schedule.size() >= kMaxTraceSteps) {
      throw Error(f.field("budget_trace.replay") + ": " + file + ": more than " + std::to_string(kMaxTraceSteps) + " lines");
    }
    s->schedule.emplace_back(t_s, line.substr(comma + 1));
  }
}

void read_budget_trace(const json& j, const Fields& f, Scenario* s) {
  if (!j.contains("budget_trace")) return;
  const json& t = j["budget_trace"];
  if (t.is_object() && t.size() == 1 && t.contains("sawtooth")) return read_sawtooth(t["sawtooth"], f, s);
  if (t.is_object() && t.size() == 1 && t.contains("replay")) return read_replay(t["replay"], f, s);
  throw Error(f.field("budget_trace") + " must be {\"sawtooth\": {...}} or {\"replay\": FILE} (Note [Budget traces])");
}

}  // namespace

Scenario load_scenario(const std::string& path, const std::string& models_dir) {
  const json j = parse_file(path);
  const Fields f{path};
  Scenario s;
  read_header(j, f, &s);
  read_models(j, f, models_dir, &s);
  read_groups(j, f, &s);
  read_schedule(j, f, &s);
  read_budget_trace(j, f, &s);
  return s;
}

std::uint64_t budget_value(const std::string& text, std::uint64_t whole, const std::string& what) {
  // A sawtooth's step between two budgets (Note [Budget traces]): "A~B@x" is A + x (B - A).
  const size_t tilde = text.find('~'), at = text.rfind('@');
  if (tilde != std::string::npos && at != std::string::npos && at > tilde) {
    const double a = static_cast<double>(budget_value(text.substr(0, tilde), whole, what));
    const double b = static_cast<double>(budget_value(text.substr(tilde + 1, at - tilde - 1), whole, what));
    double x = -1;
    try {
      x = std::stod(text.substr(at + 1));
    } catch (...) {
    }
    if (!(x >= 0 && x <= 1)) throw Error(what + ": '" + text + "' is not a step between two budgets");
    return static_cast<std::uint64_t>(a + x * (b - a));
  }
  if (!text.empty() && text.back() == '%') {
    double pct = 0;
    try {
      pct = std::stod(text.substr(0, text.size() - 1));
    } catch (...) {
      throw Error(what + ": '" + text + "' is not a percentage");
    }
    if (!(pct > 0)) throw Error(what + ": '" + text + "' must be > 0%");
    return static_cast<std::uint64_t>(static_cast<double>(whole) * pct / 100.0);
  }
  try {
    return parse_size(text);
  } catch (const std::exception& e) {
    throw Error(what + ": " + e.what());
  }
}

bool has_deadlines(const Scenario& s) {
  for (const auto& m : s.models) {
    if (m.slo_ms > 0) return true;
  }
  for (const auto& g : s.groups) {
    if (g.slo_ms > 0) return true;
  }
  return false;
}

}  // namespace cli
}  // namespace swapnet
