// The device profile file (JSON): where it lives, writing it atomically, reading it back with
// every field checked, and whether it was measured on this machine.
#include "swapnet/partitioner.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>

namespace swapnet {
namespace {

std::string host_name() {
  struct utsname u {};
  return ::uname(&u) == 0 ? u.nodename : "";
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "";
}

}  // namespace

std::string default_profile_path() {
  if (const char* p = std::getenv("SWAPNET_PROFILE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/swapnet/device.json";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/swapnet/device.json";
}

Status save_profile(const std::string& path, const DeviceProfile& p) {
  nlohmann::json j = {{"version", p.version},
                      {"host", p.host.empty() ? host_name() : p.host},
                      {"cpu", p.cpu.empty() ? cpu_model() : p.cpu},
                      {"threads", p.threads},
                      {"created", p.created},
                      {"image", p.image},
                      {"raw_read_mb_s", p.raw_read_mb_s},
                      {"sustained_read_mb_s", p.sustained_read_mb_s},
                      {"alpha_ms_per_byte", p.cost.alpha_ms_per_byte},
                      {"beta_ms_per_tensor", p.cost.beta_ms_per_tensor},
                      {"block_ms", p.cost.block_ms},
                      {"eta_ms_per_tensor", p.cost.eta_ms_per_tensor},
                      {"inference_ms", p.cost.inference_ms},
                      {"gamma_ms_per_flop", p.gamma_ms_per_flop},
                      {"pipeline_extra_block_ms", p.pipeline_extra_block_ms},
                      {"pipeline_error", p.pipeline_error},
                      {"calibration_direct_ms", p.calibration_direct_ms},
                      {"calibration_exec_ms", p.calibration_exec_ms},
                      {"t_in_error", p.t_in_error},
                      {"t_out_error", p.t_out_error},
                      {"exec_error_flops", p.exec_error_flops},
                      {"exec_error_measured", p.exec_error_measured},
                      {"exec_source", p.exec_source}};
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    // Create the directory chain (~/.cache/swapnet) as needed.
    std::string dir = path.substr(0, slash);
    for (size_t pos = 1; pos <= dir.size(); ++pos) {
      if (pos == dir.size() || dir[pos] == '/') (void)::mkdir(dir.substr(0, pos).c_str(), 0755);
    }
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << j.dump(2) << "\n";
    if (!f) return Status::error(-1, path + ": cannot write the device profile (" + tmp + ")");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Status::error(-1, path + ": cannot rename " + tmp + " onto it");
  return Status();
}

Status load_profile(const std::string& path, DeviceProfile* out) {
  std::ifstream f(path);
  if (!f) return Status::error(-1, path + ": no device profile there (run `swapnet profile IMAGE -o " + path + "`)");
  nlohmann::json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    return Status::error(-1, path + ": not a device profile (invalid JSON: " + e.what() + ")");
  }
  DeviceProfile p;
  auto num = [&](const char* key, double* v, bool positive) -> Status {
    if (!j.contains(key) || !j[key].is_number()) return Status::error(-1, path + ": field '" + key + "' is missing or not a number");
    *v = j[key].get<double>();
    if (!std::isfinite(*v) || *v < 0 || (positive && *v == 0)) {
      return Status::error(-1, path + ": field '" + key + "' = " + std::to_string(*v) + " is out of range (must be " +
                           (positive ? "> 0" : ">= 0") + ")");
    }
    return Status();
  };
  if (!j.is_object()) return Status::error(-1, path + ": not a device profile (not a JSON object)");
  double version = 0, threads = 0;
  if (Status s = num("version", &version, true); !s.ok()) return s;
  if (static_cast<int>(version) != DeviceProfile::kVersion) {
    return Status::error(-1, path + ": device profile version " + std::to_string(static_cast<int>(version)) +
                                 ", this swapnet reads " + std::to_string(DeviceProfile::kVersion) +
                                 " (run `swapnet profile` again)");
  }
  for (auto [key, v, pos] : {std::tuple<const char*, double*, bool>{"threads", &threads, true},
                             {"raw_read_mb_s", &p.raw_read_mb_s, true},
                             {"sustained_read_mb_s", &p.sustained_read_mb_s, true},
                             {"alpha_ms_per_byte", &p.cost.alpha_ms_per_byte, true},
                             {"beta_ms_per_tensor", &p.cost.beta_ms_per_tensor, false},
                             {"block_ms", &p.cost.block_ms, false},
                             {"eta_ms_per_tensor", &p.cost.eta_ms_per_tensor, false},
                             {"inference_ms", &p.cost.inference_ms, false},
                             {"pipeline_error", &p.pipeline_error, false},
                             {"gamma_ms_per_flop", &p.gamma_ms_per_flop, false},
                             {"t_in_error", &p.t_in_error, false},
                             {"t_out_error", &p.t_out_error, false},
                             {"exec_error_flops", &p.exec_error_flops, false},
                             {"exec_error_measured", &p.exec_error_measured, false}}) {
    Status s = num(key, v, pos);
    if (!s.ok()) return s;
  }
  p.version = static_cast<int>(version);
  // Informational fields: read when present.
  for (auto [key, v] : {std::pair<const char*, double*>{"pipeline_extra_block_ms", &p.pipeline_extra_block_ms},
                        {"calibration_direct_ms", &p.calibration_direct_ms},
                        {"calibration_exec_ms", &p.calibration_exec_ms}}) {
    if (j.contains(key) && j[key].is_number()) *v = j[key].get<double>();
  }
  p.threads = static_cast<int>(threads);
  for (auto [key, v] : {std::pair<const char*, std::string*>{"host", &p.host},
                        {"cpu", &p.cpu},
                        {"created", &p.created},
                        {"image", &p.image},
                        {"exec_source", &p.exec_source}}) {
    if (!j.contains(key) || !j[key].is_string()) return Status::error(-1, path + ": field '" + key + "' is missing or not a string");
    *v = j[key].get<std::string>();
  }
  if (p.exec_source != "measured" && p.exec_source != "flops") {
    return Status::error(-1, path + ": field 'exec_source' = '" + p.exec_source + "' is not measured|flops");
  }
  *out = std::move(p);
  return Status();
}

std::string profile_mismatch(const DeviceProfile& p, int threads) {
  if (p.host != host_name()) return "it was measured on host '" + p.host + "', this is '" + host_name() + "'";
  if (p.cpu != cpu_model()) return "it was measured on CPU '" + p.cpu + "', this is '" + cpu_model() + "'";
  if (p.threads != threads) {
    return "it was measured with " + std::to_string(p.threads) + " threads, this run uses " + std::to_string(threads);
  }
  return "";
}

}  // namespace swapnet
