// libFuzzer target for `swapnet serve`'s scenario files (cli/scenario.cpp, issue 18): any bytes
// as a scenario file. Reading one must either give a scenario that holds together or throw
// swapnet::Error naming the file; nothing else (a crash, another exception, a leak, undefined
// behaviour) is allowed. The images a scenario names are looked up on disk, so a directory of
// empty files with the shipped scenarios' image names stands in for the models (the parser
// checks that they exist and loads nothing).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <system_error>

#include "scenario.h"
#include "swapnet/swapcore.h"

namespace {

struct Dir {
  std::string root;
  std::string models;
  std::string file;
  Dir() {
    char tmpl[] = "/tmp/swapnet-fuzz-scenario-XXXXXX";
    if (!::mkdtemp(tmpl)) std::abort();
    root = tmpl;
    models = root + "/models";
    ::mkdir(models.c_str(), 0755);
    for (const char* name : {"resnet18", "mobilenet_v2", "resnet101", "yolov3", "vgg19", "fcn_resnet101"}) {
      std::FILE* f = std::fopen((models + "/" + name + ".swapnet").c_str(), "w");
      if (!f) std::abort();
      std::fclose(f);
    }
    file = root + "/scenario.json";
  }
  ~Dir() {
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
};

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_scenario: a scenario was accepted although %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Dir dir;
  std::FILE* f = std::fopen(dir.file.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  using swapnet::cli::Scenario;
  Scenario s;
  try {
    s = swapnet::cli::load_scenario(dir.file, dir.models);
  } catch (const swapnet::Error& e) {
    const std::string what = e.what();
    check(what.rfind(dir.file, 0) == 0, "an error did not name the file");
    return 0;
  }
  // What serve relies on once a scenario is read.
  check(!s.models.empty(), "it has no models");
  check(s.duration_s > 0, "its duration is not > 0");
  check(s.workers >= 0, "it has fewer than zero workers (0: chosen by serve)");
  std::set<std::string> names;
  for (const auto& m : s.models) {
    check(names.insert(m.rt.name).second, "two models have one name");
    struct stat sb;
    check(::stat(m.rt.image.c_str(), &sb) == 0, "a model's image does not exist");
    check(m.rt.urgency > 0 && m.rt.threads >= 0 && m.rate_hz >= 0 && m.period_ms >= 0 && m.slo_ms >= 0,
          "a model field is out of range");
    check(m.jitter_ms >= 0 && (m.period_ms == 0 || m.jitter_ms < m.period_ms), "a jitter is not below its period");
    check(m.group >= -1 && m.group < static_cast<int>(s.groups.size()), "a model's group does not exist");
  }
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    check(!s.groups[g].members.empty() && s.groups[g].period_ms > 0 && s.groups[g].slo_ms > 0, "a group is empty");
    for (int i : s.groups[g].members) {
      check(i >= 0 && i < static_cast<int>(s.models.size()) && s.models[i].group == static_cast<int>(g),
            "a group's member is not that group's");
    }
  }
  // The budgets are read as serve reads them: a size or a percentage, or an Error naming the file.
  auto budget = [&](const std::string& text, const std::string& field) {
    try {
      swapnet::cli::budget_value(text, 1ull << 30, dir.file + ": field '" + field + "'");
    } catch (const swapnet::Error& e) {
      check(std::string(e.what()).rfind(dir.file, 0) == 0, "a budget's error did not name the file");
    }
  };
  budget(s.total, "total_budget");
  for (const auto& entry : s.schedule) budget(entry.second, "schedule");
  return 0;
}
