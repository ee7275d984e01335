// The budgeter: splits a total budget among models (scheduler.h). Pure arithmetic over each
// model's demand; no torch, no I/O.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "swapnet/scheduler.h"

namespace swapnet {

double ModelDemand::predict_ms(std::uint64_t budget) const {
  if (budget < min_bytes) return std::numeric_limits<double>::infinity();
  if (curve.empty()) return latency_ms;
  double ms = curve.front().second;
  for (const auto& [b, t] : curve) {
    if (b > budget) break;
    ms = t;
  }
  return ms;
}

std::uint64_t ModelDemand::budget_for(double ms) const {
  if (curve.empty()) return latency_ms <= ms ? min_bytes : full_bytes;
  for (const auto& [b, t] : curve) {
    if (t <= ms) return std::max(b, min_bytes);
  }
  return full_bytes;
}

namespace {

// The paper's Eq. 1: (1 - 1/n) of M in proportion to each model's demand, 1/n in proportion to
// its performance score PS_i = u_i * latency_i / memory_i.
class PaperPolicy final : public BudgetPolicy {
 public:
  std::string name() const override { return "paper"; }
  std::vector<double> split(const std::vector<ModelDemand>& m, std::uint64_t total) const override {
    const double n = static_cast<double>(m.size());
    double sum_m = 0, sum_ps = 0;
    std::vector<double> ps;
    for (const auto& d : m) {
      sum_m += static_cast<double>(d.full_bytes);
      ps.push_back(d.full_bytes ? d.urgency * d.latency_ms / static_cast<double>(d.full_bytes) : 0.0);
      sum_ps += ps.back();
    }
    const double M = static_cast<double>(total);
    std::vector<double> a;
    for (size_t i = 0; i < m.size(); ++i) {
      const double by_size = sum_m > 0 ? static_cast<double>(m[i].full_bytes) / sum_m : 1.0 / n;
      const double by_score = sum_ps > 0 ? ps[i] / sum_ps : 1.0 / n;
      a.push_back(by_size * (1 - 1 / n) * M + by_score * (1 / n) * M);
    }
    return a;
  }
};

class EqualPolicy final : public BudgetPolicy {
 public:
  std::string name() const override { return "equal"; }
  std::vector<double> split(const std::vector<ModelDemand>& m, std::uint64_t total) const override {
    return std::vector<double>(m.size(), static_cast<double>(total) / static_cast<double>(m.size()));
  }
};

// The smallest T such that every model's cheapest budget predicted within T fits the total,
// found over the curves' latencies (a binary search: the budget needed falls as T grows); what
// is left over is shared in proportion to each model's room below its full demand.
class MinMaxPolicy final : public BudgetPolicy {
 public:
  std::string name() const override { return "minmax"; }
  std::vector<double> split(const std::vector<ModelDemand>& m, std::uint64_t total) const override {
    std::vector<double> ts;
    for (const auto& d : m) {
      ts.push_back(d.latency_ms);
      for (const auto& p : d.curve) ts.push_back(p.second);
    }
    std::sort(ts.begin(), ts.end());
    ts.erase(std::unique(ts.begin(), ts.end()), ts.end());
    auto need = [&](double t) {
      std::vector<std::uint64_t> b;
      for (const auto& d : m) b.push_back(std::max(d.budget_for(t), d.min_bytes));
      return b;
    };
    auto fits = [&](const std::vector<std::uint64_t>& b) {
      return std::accumulate(b.begin(), b.end(), std::uint64_t{0}) <= total;
    };
    size_t lo = 0, hi = ts.size();  // the first feasible index in [lo, hi); hi: none found
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (fits(need(ts[mid]))) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    std::vector<std::uint64_t> b;
    if (lo < ts.size()) {
      b = need(ts[lo]);
    } else {
      for (const auto& d : m) b.push_back(d.min_bytes);
    }
    const std::uint64_t used = std::accumulate(b.begin(), b.end(), std::uint64_t{0});
    double room = 0;
    for (size_t i = 0; i < m.size(); ++i) room += static_cast<double>(m[i].full_bytes - std::min(b[i], m[i].full_bytes));
    std::vector<double> a;
    for (size_t i = 0; i < m.size(); ++i) {
      const double r = static_cast<double>(m[i].full_bytes - std::min(b[i], m[i].full_bytes));
      const double extra = used < total && room > 0 ? static_cast<double>(total - used) * r / room : 0.0;
      a.push_back(static_cast<double>(b[i]) + extra);
    }
    return a;
  }
};

}  // namespace

std::unique_ptr<BudgetPolicy> make_policy(const std::string& name) {
  if (name == "paper") return std::make_unique<PaperPolicy>();
  if (name == "equal") return std::make_unique<EqualPolicy>();
  if (name == "minmax") return std::make_unique<MinMaxPolicy>();
  throw Error("budget policy '" + name + "' is not one of paper, equal, minmax");
}

// Water-filling: b_i = clamp(lambda * want_i, min_i, full_i), with lambda found by bisection so
// that the b_i sum to the total (their sum grows with lambda). A model wanting nothing is given
// a token want, so that it still grows once the others are full.
std::vector<std::uint64_t> fit_budgets(const std::vector<double>& want, const std::vector<ModelDemand>& m,
                                       std::uint64_t total) {
  const size_t n = m.size();
  std::vector<double> w(n), lo(n), hi(n);
  double wmax = 0;
  for (size_t i = 0; i < n; ++i) wmax = std::max(wmax, want[i]);
  for (size_t i = 0; i < n; ++i) {
    w[i] = want[i] > 0 ? want[i] : std::max(wmax, 1.0) * 1e-9;
    lo[i] = static_cast<double>(m[i].min_bytes);
    hi[i] = static_cast<double>(std::max(m[i].min_bytes, m[i].full_bytes));
  }
  auto at = [&](double lambda) {
    std::vector<double> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = std::clamp(lambda * w[i], lo[i], hi[i]);
    return b;
  };
  auto sum_of = [](const std::vector<double>& b) { return std::accumulate(b.begin(), b.end(), 0.0); };
  const double T = static_cast<double>(total);
  double a = 0, z = 1;
  while (sum_of(at(z)) < T && z < 1e30) z *= 2;
  for (int it = 0; it < 200; ++it) {
    const double mid = (a + z) / 2;
    (sum_of(at(mid)) <= T ? a : z) = mid;
  }
  const std::vector<double> b = at(a);
  std::vector<std::uint64_t> out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back(std::clamp(static_cast<std::uint64_t>(std::floor(b[i])), m[i].min_bytes,
                             std::max(m[i].min_bytes, m[i].full_bytes)));
  }
  return out;
}

Allocation allocate(const BudgetPolicy& policy, const std::vector<ModelDemand>& models, std::uint64_t total) {
  const size_t n = models.size();
  Allocation a;
  a.budgets.assign(n, 0);
  a.paused.assign(n, 0);
  std::uint64_t sum_full = 0;
  for (const auto& d : models) sum_full += d.full_bytes;
  if (sum_full <= total) {
    for (size_t i = 0; i < n; ++i) a.budgets[i] = models[i].full_bytes;
    a.note = "every model fits whole (" + format_bytes(sum_full) + " of " + format_bytes(total) + "): no swapping";
    return a;
  }
  // Pause while the minimums do not fit: lowest urgency first, then the largest minimum.
  std::vector<size_t> run(n);
  std::iota(run.begin(), run.end(), 0);
  auto sum_min = [&] {
    std::uint64_t s = 0;
    for (size_t i : run) s += models[i].min_bytes;
    return s;
  };
  std::string note;
  while (!run.empty() && sum_min() > total) {
    const std::uint64_t need = sum_min();
    auto victim = std::min_element(run.begin(), run.end(), [&](size_t x, size_t y) {
      if (models[x].urgency != models[y].urgency) return models[x].urgency < models[y].urgency;
      return models[x].min_bytes > models[y].min_bytes;
    });
    const size_t v = *victim;
    a.paused[v] = 1;
    note += models[v].name + " paused (its minimum " + format_bytes(models[v].min_bytes) + "; the minimums of " +
            std::to_string(run.size()) + " models sum to " + format_bytes(need) + " > " + format_bytes(total) + "); ";
    run.erase(victim);
  }
  // The greedy pass may have paused more than needed (a large minimum went after a small one):
  // readmit the paused that still fit, most urgent first.
  std::vector<size_t> out_of_run;
  for (size_t i = 0; i < n; ++i) {
    if (a.paused[i]) out_of_run.push_back(i);
  }
  std::sort(out_of_run.begin(), out_of_run.end(),
            [&](size_t x, size_t y) { return models[x].urgency > models[y].urgency; });
  for (size_t v : out_of_run) {
    if (sum_min() + models[v].min_bytes <= total) {
      a.paused[v] = 0;
      run.push_back(v);
      note += models[v].name + " readmitted; ";
    }
  }
  std::sort(run.begin(), run.end());
  if (run.empty()) {
    a.note = note + "no model can run";
    return a;
  }
  std::vector<ModelDemand> sub;
  std::uint64_t sub_full = 0;
  for (size_t i : run) {
    sub.push_back(models[i]);
    sub_full += models[i].full_bytes;
  }
  std::vector<std::uint64_t> b;
  if (sub_full <= total) {
    for (const auto& d : sub) b.push_back(d.full_bytes);
  } else {
    a.swapping = true;
    const std::vector<double> want = policy.split(sub, total);
    b = fit_budgets(want, sub, total);
    for (size_t k = 0; k < sub.size(); ++k) {
      if (want[k] < static_cast<double>(sub[k].min_bytes)) {
        note += sub[k].name + " raised from " + format_bytes(static_cast<std::uint64_t>(std::max(want[k], 0.0))) +
                " to its minimum " + format_bytes(sub[k].min_bytes) + "; ";
      }
    }
  }
  for (size_t k = 0; k < run.size(); ++k) a.budgets[run[k]] = b[k];
  if (note.size() >= 2) note.resize(note.size() - 2);
  a.note = note.empty() ? policy.name() + " split of " + format_bytes(total) : policy.name() + " split of " +
                                                                                  format_bytes(total) + ": " + note;
  return a;
}

}  // namespace swapnet
