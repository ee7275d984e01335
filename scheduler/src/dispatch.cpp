// Dispatch policies (scheduler.h): which job waiting for a worker runs its next block.
//
// Note [Dispatch policies]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Band (band.txt, Section 4) schedules a request's subgraphs over heterogeneous processors with
// expected latencies kept as EWMAs (alpha 0.1), and its least-slack-time policy drops a request
// as soon as its expected finish is past its deadline: running it would only delay the others.
// We adopt both at block granularity: a job's expected remaining time is the sum of its blocks'
// EWMAs (seeded from the cost model: execution, or the read when it is longer), its slack is
// deadline - now - remaining. With one kind of worker (the CPU here), Band's DP over units and
// processors has nothing to choose among, so what remains of it is the order: which block next.
//
// Note [A floor against starvation]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Least slack first serves, under overload, the requests closest to their deadlines and drops
// the others as soon as they cannot finish: a model whose requests always have more slack than
// another's always waits, and is dropped wholesale. Measured on 2026-11-27 (resnet101 every
// 600 ms due in 600, beside yolov3, fcn_resnet101 and vgg19 at 1.2-1.8 s): resnet101, which
// meets its deadline alone in 300 ms, met 10-14 % of them. The rule we chose is a minimum
// share: a model that met fewer than kFloor (30 %) of its recent deadlines (an EWMA over its
// requests, alpha 0.1) goes before the others while it can still meet its deadline. A model
// held at the floor hovers around it (it goes first, meets one, is above the floor, waits, is
// dropped, ...): with a floor of 20 % yolov3 met 13 % of 15 requests in self_driving_slo.json
// at load 1.2 (2026-11-27), so the floor is set above the 20 % we promise. It costs
// the other models at most that share of their turns, and only while the model is starved; a
// model that cannot meet its deadline even alone is still dropped (its slack is negative).
// Puzzle's group QoE needs groups, and degrading a model is not ours to do (lossless).
//
// Note [Admission by expected finish]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Band's least slack drops a request when its own remaining time no longer fits before its
// deadline, whenever that is found, mid-inference too. Under overload that wastes the work the
// request had done, and a request admitted now may be dropped two blocks later once the
// requests before it have run: on 2026-11-27 two_rates.json at load 0.9 (whose measured
// direct latencies were 1.8x below the ones in service: really overloaded) met 0.7 % and 7 %
// of its deadlines in two runs, nearly every request started and dropped. So a request is
// admitted before its first block on its expected finish behind the work that would go before
// it (the requests waiting with more urgency, their remaining time over the workers), and
// dropped there if it would be late; once it has run a block it is dropped only when it cannot
// finish even alone.
//
// Note [HEFT on identical workers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Band's HEFT (mrsnu/band, heterogeneous_earliest_finish_time_scheduler.cc) looks at the jobs
// waiting, computes for each the least expected finish time over the processors, counting each
// processor's queue and the *reservations* other jobs hold on it (a job granted a subgraph
// reserves its next one), and dispatches the job whose least finish time is the *largest*: the
// job most at risk of finishing late goes first. It neither drops nor looks at deadlines.
// With `workers` identical workers there is one choice of processor, so a job's expected finish
// is the others' reserved work spread over the workers plus its own remaining time; the largest
// goes first (ties: first come). A job granted a block reserves the block after it (`then_ms`)
// until it is granted again; its own reservation never delays itself. A request that ends
// early (dropped elsewhere, failed, paused) leaves its reservation until the model's next
// request is granted: it delays every other job alike, so it changes only how that model ranks.
//
// Note [The disk as a scheduled resource]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Hetero²Pipe (hetero2pipe.txt) orders the stages of several DNNs so that the ones that contend
// for a shared resource (memory bandwidth there) overlap with ones that do not. Here the shared
// resources are the cores and one disk: every model's executor reads its blocks ahead on its
// own, and a worker given to a job whose next block is still being read sits idle until the
// bytes land, while another job's block, already in memory, waits for a core. The "+io"
// variant of a policy sees each job's `unread_ms` (refreshed at every decision from the
// executor's read state). When the policy's choice is a block still on its way, the policy's
// choice among the blocks in memory runs instead if it is expected to end before the first
// one's bytes land: the core does work it would otherwise wait through, and the job passed
// over loses nothing (its read goes on meanwhile). A first version passed over any block still
// being read: on throttled storage the urgent job then waited a whole block for a core once
// its bytes landed, and deadlines met fell by 8-14 % (docs/scheduler.md). With a stateful
// policy (rr, heft) the choice among blocks in memory, when not taken, leaves its mark (heft:
// that job's reservation until it is granted).
//
// The "+io" variant also orders the reads themselves: the runtime puts every model's reader on
// one SharedDisk per device and sets each job's read priority to the policy's urgency() at each
// decision (a job with no request waiting reads last), so the disk serves the most urgent job's
// blocks first instead of every model's read-ahead in the order it came (Note [One disk, read
// by urgency] in shared_disk.cpp).
#include <sched.h>

#include <algorithm>
#include <limits>
#include <map>

#include "swapnet/scheduler.h"

namespace swapnet {
namespace {

// First come, first served.
class Fifo : public DispatchPolicy {
 public:
  std::string name() const override { return "fifo"; }
  DispatchDecision pick(const std::vector<DispatchCandidate>& w, double) override {
    DispatchDecision d;
    for (size_t i = 0; i < w.size(); ++i) {
      if (d.pick < 0 || w[i].arrival_ms < w[static_cast<size_t>(d.pick)].arrival_ms) d.pick = static_cast<int>(i);
    }
    return d;
  }
};

// A block each, models in turn: the first waiting model after the one served last.
class RoundRobin : public DispatchPolicy {
 public:
  std::string name() const override { return "rr"; }
  DispatchDecision pick(const std::vector<DispatchCandidate>& w, double) override {
    DispatchDecision d;
    auto after = [&](int m) { return m > last_ ? m - last_ : m - last_ + (1 << 30); };  // distance after last_
    for (size_t i = 0; i < w.size(); ++i) {
      if (d.pick < 0 || after(w[i].model) < after(w[static_cast<size_t>(d.pick)].model)) d.pick = static_cast<int>(i);
    }
    last_ = w[static_cast<size_t>(d.pick)].model;
    return d;
  }

 private:
  int last_ = -1;
};

// Shortest expected latency: the job expected to finish first (ties: first come).
class ShortestExpected : public DispatchPolicy {
 public:
  std::string name() const override { return "sel"; }
  DispatchDecision pick(const std::vector<DispatchCandidate>& w, double) override {
    DispatchDecision d;
    for (size_t i = 0; i < w.size(); ++i) {
      if (d.pick < 0) {
        d.pick = static_cast<int>(i);
        continue;
      }
      const DispatchCandidate& b = w[static_cast<size_t>(d.pick)];
      if (w[i].remaining_ms < b.remaining_ms || (w[i].remaining_ms == b.remaining_ms && w[i].arrival_ms < b.arrival_ms)) {
        d.pick = static_cast<int>(i);
      }
    }
    return d;
  }
  double urgency(const DispatchCandidate& c) const override { return c.remaining_ms; }
};

// Least slack time, with admission and early drop (Note [Dispatch policies], Note [Admission
// by expected finish], Note [A floor against starvation]).
class LeastSlack : public DispatchPolicy {
 public:
  explicit LeastSlack(int workers) : workers_(std::max(1, workers)) {}
  std::string name() const override { return "lst"; }
  // The latest start (deadline - remaining): slack's order at any one time, fixed in time.
  // Requests without a deadline after those with one, first come first served.
  double urgency(const DispatchCandidate& c) const override {
    return c.deadline_ms > 0 ? c.deadline_ms - c.remaining_ms : 1e12 + c.arrival_ms;
  }
  DispatchDecision pick(const std::vector<DispatchCandidate>& w, double now) override {
    // The order they would run in: starved models first, then least slack (latest start), then
    // first come.
    std::vector<size_t> order(w.size());
    for (size_t i = 0; i < w.size(); ++i) order[i] = i;
    auto starved = [&](size_t i) { return w[i].deadline_ms > 0 && w[i].met_share < kFloor; };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      if (starved(a) != starved(b)) return starved(a);
      const double ua = urgency(w[a]), ub = urgency(w[b]);
      return ua != ub ? ua < ub : w[a].arrival_ms < w[b].arrival_ms;
    });
    DispatchDecision d;
    double ahead = 0;  // work of the requests going before, ms
    for (size_t i : order) {
      const DispatchCandidate& c = w[i];
      // Admission (before a request's first block): its expected finish, behind the work
      // ahead of it spread over the workers; once started, dropped only when it cannot finish
      // even alone (its work is not wasted on a guess about others').
      const double finish = now + c.remaining_ms + (c.started ? 0.0 : ahead / workers_);
      if (c.deadline_ms > 0 && finish > c.deadline_ms) {
        d.drop.push_back(static_cast<int>(i));
        continue;
      }
      if (d.pick < 0) d.pick = static_cast<int>(i);
      ahead += c.remaining_ms;
    }
    std::sort(d.drop.begin(), d.drop.end());
    return d;
  }
  static constexpr double kFloor = 0.3;

 private:
  int workers_;
};

// Heterogeneous earliest finish time with reservation (Note [HEFT on identical workers]).
class Heft : public DispatchPolicy {
 public:
  explicit Heft(int workers) : workers_(std::max(1, workers)) {}
  std::string name() const override { return "heft"; }
  DispatchDecision pick(const std::vector<DispatchCandidate>& w, double) override {
    DispatchDecision d;
    double reserved = 0;
    for (const auto& [model, ms] : reserved_) reserved += ms;
    double best = -1;
    for (size_t i = 0; i < w.size(); ++i) {
      auto own = reserved_.find(w[i].model);
      const double others = reserved - (own == reserved_.end() ? 0.0 : own->second);
      const double finish = others / workers_ + w[i].remaining_ms;
      if (d.pick < 0 || finish > best ||
          (finish == best && w[i].arrival_ms < w[static_cast<size_t>(d.pick)].arrival_ms)) {
        d.pick = static_cast<int>(i);
        best = finish;
      }
    }
    const DispatchCandidate& c = w[static_cast<size_t>(d.pick)];
    if (c.then_ms > 0) {
      reserved_[c.model] = c.then_ms;
    } else {
      reserved_.erase(c.model);
    }
    return d;
  }

 private:
  int workers_;
  std::map<int, double> reserved_;  // model -> expected time of the block it will ask for next
};

// A policy that gives workers to jobs whose next block is in memory first (Note [The disk as
// a scheduled resource]).
class DiskAware : public DispatchPolicy {
 public:
  explicit DiskAware(std::unique_ptr<DispatchPolicy> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name() + "+io"; }
  bool reads_unread() const override { return true; }
  double urgency(const DispatchCandidate& c) const override { return inner_->urgency(c); }
  DispatchDecision pick(const std::vector<DispatchCandidate>& w, double now) override {
    DispatchDecision first = inner_->pick(w, now);
    if (first.pick < 0 || w[static_cast<size_t>(first.pick)].unread_ms <= 0) return first;
    const DispatchCandidate& urgent = w[static_cast<size_t>(first.pick)];
    std::vector<int> ready;
    for (size_t i = 0; i < w.size(); ++i) {
      const bool dropped = std::find(first.drop.begin(), first.drop.end(), static_cast<int>(i)) != first.drop.end();
      if (w[i].unread_ms <= 0 && !dropped) ready.push_back(static_cast<int>(i));
    }
    if (ready.empty()) return first;
    std::vector<DispatchCandidate> sub;
    for (int i : ready) sub.push_back(w[static_cast<size_t>(i)]);
    const DispatchDecision alt = inner_->pick(sub, now);  // the policy's choice among blocks in memory
    const int other = alt.pick >= 0 ? ready[static_cast<size_t>(alt.pick)] : -1;
    // No regret: run the block in memory only if it ends before the urgent one's bytes land.
    if (other >= 0 && w[static_cast<size_t>(other)].next_ms <= urgent.unread_ms) {
      first.pick = other;
    } else {
      (void)inner_->pick({urgent}, now);  // stateful policies (rr, heft) record the job granted
    }
    return first;
  }

 private:
  std::unique_ptr<DispatchPolicy> inner_;
};

}  // namespace

std::unique_ptr<DispatchPolicy> make_dispatch_policy(const std::string& name, int workers) {
  const std::string io = "+io";
  if (name.size() > io.size() && name.compare(name.size() - io.size(), io.size(), io) == 0) {
    if (name == "threads" + io) throw Error("scheduler 'threads+io': threads has no central scheduler to make disk-aware");
    return std::make_unique<DiskAware>(make_dispatch_policy(name.substr(0, name.size() - io.size()), workers));
  }
  if (name == "fifo") return std::make_unique<Fifo>();
  if (name == "rr") return std::make_unique<RoundRobin>();
  if (name == "sel") return std::make_unique<ShortestExpected>();
  if (name == "lst") return std::make_unique<LeastSlack>(workers);
  if (name == "heft") return std::make_unique<Heft>(workers);
  throw Error("scheduler '" + name + "' is not one of threads, fifo, rr, sel, lst, heft (or one of those + \"+io\")");
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace swapnet
