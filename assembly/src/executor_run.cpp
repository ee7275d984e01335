// An inference: begin, step (bind a block where its bytes landed, run its layers, swap it out),
// finish (outputs copied out of memory the next inference reuses), abort. The weights are read
// ahead by the BlockCursor (Note [Read-ahead ring] in executor.cpp, Note [Layer by layer] in
// read_ahead.cpp).
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>

#include <chrono>
#include <string>
#include <vector>

#include "executor_impl.h"

namespace swapnet {
using detail::AccountScope;

namespace {
// `v` with every tensor whose storage lies in [lo, hi) replaced by a copy (`copied` counts the
// bytes); containers are rebuilt only where something was copied.
c10::IValue evict_from(const c10::IValue& v, const char* lo, const char* hi, std::uint64_t* copied) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.has_storage()) return v;
    const char* p = static_cast<const char*>(t.storage().data());
    if (p == nullptr || p < lo || p >= hi) return v;
    *copied += t.nbytes();
    return t.clone();
  }
  if (v.isTuple()) {
    const auto& elems = v.toTupleRef().elements();
    std::vector<c10::IValue> out;
    bool changed = false;
    for (const auto& e : elems) {
      out.push_back(evict_from(e, lo, hi, copied));
      changed = changed || !out.back().isSameIdentity(e);
    }
    if (!changed) return v;
    return c10::ivalue::Tuple::createNamed(std::move(out), c10::TypePtr(v.toTupleRef().type()));  // named stays named
  }
  if (v.isList()) {
    c10::List<c10::IValue> l = v.toList();
    c10::impl::GenericList out(l.elementType());
    bool changed = false;
    for (size_t i = 0; i < l.size(); ++i) {
      const c10::IValue e = l.get(i);
      out.push_back(evict_from(e, lo, hi, copied));
      changed = changed || !out.get(i).isSameIdentity(e);
    }
    return changed ? c10::IValue(out) : v;
  }
  if (v.isGenericDict()) {
    c10::impl::GenericDict d = v.toGenericDict();
    c10::impl::GenericDict out(d.keyType(), d.valueType());
    bool changed = false;
    for (const auto& e : d) {
      c10::IValue nv = evict_from(e.value(), lo, hi, copied);
      changed = changed || !nv.isSameIdentity(e.value());
      out.insert(e.key(), std::move(nv));
    }
    return changed ? c10::IValue(out) : v;
  }
  return v;
}
}  // namespace

void Executor::begin(std::vector<c10::IValue> inputs) {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  // Shed (shed_pending): the first step() re-plans, or returns at once for the move a cut's
  // interrupt asks for; re-planning here would read back at the old budget first.
  if (m.released) throw Error(m.path + ": released (no memory held): set_budget() first");
  if (m.run) throw Error(m.path + ": an inference is already in progress (finish() or abort() it first)");
  m.reader->check_file().throw_if_error();  // Note [The image changing on disk] (block_reader.cpp)
  {
    std::vector<ImageInput> in = describe_inputs(inputs);
    if (!m.meter.covers(in)) start_measuring(m, std::move(in), inputs);
  }
  m.backend->place_inputs(&inputs);
  std::uint64_t inputs_outside = 0;
  for (const auto& v : inputs) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_cpu()) inputs_outside += v.toTensor().nbytes();
  }
  m.lender.set_inputs_outside(inputs_outside);
  try {
    m.run = std::make_unique<Skeleton::Run>(m.sk.begin(std::move(inputs)));
  } catch (...) {
    end_measuring(m, false);
    throw;
  }
  m.cur = 0;
  m.bound = false;
  m.cursor->done_executing();
  m.learner->begin();
  m.inference_t0 = TraceClock::now();
  m.cursor->new_inference();  // Note [Tracing]: the first stop of every inference is traced
  if (m.w.ring && m.w.ring->lend() > 0 && !m.meter.measuring()) {
    // Note [Lending the activation reserve]: this thread's account (a Runtime model's), else the
    // executor's own, places the inference's activations in the ring's zone.
    m.lender.begin(m.inference_account(), m.w.ring.get());
  }
  m.pump();
}

namespace {

std::string block_of(int b, int n) { return " (block " + std::to_string(b) + " of " + std::to_string(n) + ")"; }

// Binds block b where its bytes landed: waits for its fetch (whole, or its first layer's pieces:
// Note [Layer by layer]) unless it is resident and loaded, then reads on while it computes.
void bind_block(Executor::Impl& m, int b) {
  const auto [first, last] = m.w.plan.blocks[b];
  m.cursor->done_executing();
  if (m.w.plan.resident[b] && m.w.kept_state[b] == Weights::Kept::kLoaded) return;
  const Fetch& f = m.cursor->take(b, m.pos());
  char* at = f.bytes == 0 ? f.at
             : f.resident ? m.backend->address(*m.w.kept, f.at)
                          : m.backend->address(*m.w.ring, f.at);
  m.bind_range(f.first, last, at);
  if (f.resident && f.first == first) m.w.kept_state[b] = Weights::Kept::kLoaded;
  m.rebind_pinned();
  // Reads on before the block's work: on the host the CPU computes now; on a GPU the older
  // blocks' kernels have likely finished while this thread waited for this block's bytes, and
  // their room goes to the next reads now rather than after this block's kernels are queued.
  m.pump();
}

// Runs the next layer of block b, read as `cf` (its layers run as its pieces land where
// `pieces`), with `lk` released while it runs: shed() may give back what it does not read
// meanwhile. Then gives the ring back what the rest of the block no longer reads and reads on.
// False where the rest of the block was shed: no further layer before a re-plan.
bool run_next_layer(Executor::Impl& m, std::unique_lock<std::recursive_mutex>& lk, int b, const Fetch* cf,
                    bool pieces) {
  const int last = m.w.plan.blocks[b].second;
  if (pieces && m.cursor->pieces_left()) {
    // Note [Layer by layer]: this layer's bytes (and those before it in the block).
    Status st = m.cursor->wait_layer(m.run->next_layer());
    if (!st.ok()) throw Error(st.message() + block_of(b, static_cast<int>(m.w.plan.blocks.size())));
    if (m.cursor->pieces_left()) ++m.counters.layers_started_early;
  }
  m.running_layer = m.run->next_layer();
  m.lender.sync(m.running_layer);  // its activations go where they went before
  const bool timed = learns(m);
  if (timed) m.backend->layer_began(m.running_layer);
  lk.unlock();
  const auto layer_t0 = TraceClock::now();
  try {
    m.sk.run_layer(*m.run);
  } catch (...) {
    lk.lock();
    m.running_layer = -1;
    throw;
  }
  const auto layer_t1 = TraceClock::now();
  // The end mark goes behind the layer's work at once, before the lock is waited for (the
  // backend's layer marks are this thread's alone: DeviceBackend::layer_began).
  if (timed) m.backend->layer_ended(m.running_layer, std::chrono::duration<double, std::milli>(layer_t1 - layer_t0).count());
  if (tracing()) trace_span(m.tgroup, TraceLane::kCompute, "layer", m.running_layer, layer_t0, layer_t1, "block", b);
  lk.lock();
  // Where layers run asynchronously their times come back as the device passes them (Note
  // [Timing layers on the GPU]); the host's are all handed over at finish().
  if (timed && m.caps().async) take_layer_times(m, false);
  m.meter.note_reach();
  m.lender.measure(m.running_layer);
  m.running_layer = -1;
  if (m.shed_pending && m.run->next_layer() <= last) return false;
  bool freed = false;
  if (pieces && m.run->next_layer() <= last) {
    // Note [Layer by layer]: the bytes before the lowest layer the rest still reads are dead
    // (on a GPU once the kernels queued so far are done: Note [Ring space behind the kernels]).
    const int need = m.first_needed(b, m.run->next_layer());
    if (need > cf->first) freed = m.backend->release_front(*m.w.ring, cf->at + (m.offset(need) - m.offset(cf->first)));
  }
  // Reads on: a block streaming over the bytes given back; and, lending, a block whose limit
  // the layer that ended was the last in the way of (the zone its activations needed is free
  // now), also inside a resident block or one read whole (Note [Lending the activation
  // reserve]).
  const bool lending = m.lender.lends() && m.caps().meters_activations && m.run->next_layer() <= last;
  if (freed || lending) {
    const std::uint64_t pushed = m.cursor->fetches_pushed();
    m.pump();
    if (lending) m.counters.read_at_layer_end += m.cursor->fetches_pushed() - pushed;
  }
  return true;
}

// Swap-out after block b ran: its views dropped, its ring space released (GPU: once its kernels
// are done); a resident block read trimmed is unbound, to be read whole next time.
void swap_out(Executor::Impl& m, int b, const Fetch* cf) {
  const int last = m.w.plan.blocks[b].second;
  if (cf != nullptr && !cf->resident && cf->bytes > 0) {
    m.sk.unbind_layers(cf->first, last);
    m.rebind_pinned();
    m.backend->block_done(*m.w.ring);
    if (m.caps().async) {
      // This block's kernels are queued: wait for the previous blocks' to read on. Where the
      // next read still waits for room (a ring of one block, at the least budgets: nothing read
      // ahead, or the next block streaming over this one), this block's own kernels hold it:
      // wait for them too, so that the read starts now, not when the next step needs its block
      // (the scheduler sees it under way, as on the host).
      m.pump(BlockCursor::KernelWait::kOlder);
      if (m.cursor->starved()) m.pump(BlockCursor::KernelWait::kAll);
    } else {
      m.w.trace(m.tgroup);
    }
  } else if (cf != nullptr && cf->resident && m.w.kept_state[b] != Weights::Kept::kLoaded) {
    m.sk.unbind_layers(cf->first, last);
    m.rebind_pinned();
  }
}

}  // namespace

bool Executor::step(int stop_before) {
  Impl& m = *impl_;
  std::unique_lock<std::recursive_mutex> lk(m.mu);
  if (!m.run) throw Error(m.path + ": no inference in progress (begin() first)");
  if (m.cur >= static_cast<int>(m.w.plan.blocks.size())) return true;
  AccountScope charge(m.meter.measuring() ? m.meter.account() : m.lender.lends() ? m.lender.account() : 0);
  try {
    if (m.shed_pending) {
      // Shed between two steps for a cut whose set_budget() comes next (Runtime: the caller
      // checks for a move when step() returns): do not read back at the old budget first.
      if (m.yield.exchange(false)) return false;
      replan(m, Replan::kShed, m.planner->budget());  // no cut follows: read again what was shed
    }
    const int n = static_cast<int>(m.w.plan.blocks.size());
    if (m.cur >= n) return true;
    const int b = m.cur;
    const int last = m.w.plan.blocks[b].second;
    if (!m.bound) {
      bind_block(m, b);
      m.bound = true;
    }
    const Fetch* cf = m.cursor->executing();  // what block b was read as (none: resident, loaded)
    const bool pieces = cf != nullptr && m.cursor->runs_by_layer(*cf);
    // An interrupt is taken after at least one layer, so that a storm of them cannot stall
    // the inference.
    bool ran = false;
    while (m.run->next_layer() <= last) {
      if (m.run->next_layer() == stop_before) return false;
      if (ran && m.yield.exchange(false)) return false;  // interrupted at a layer boundary
      if (!run_next_layer(m, lk, b, cf, pieces)) return false;
      ran = true;
    }
    if (pieces) {
      Status st = m.cursor->wait_layer(last);  // all landed by now; weightless tails
      if (!st.ok()) throw Error(st.message() + block_of(b, n));
    }
    swap_out(m, b, cf);
    m.bound = false;
    m.cursor->done_executing();
    ++m.cur;
    m.pump();
    return m.cur >= n;
  } catch (...) {
    if (m.meter.refused()) {
      const int k = m.run->next_layer();
      Error why(m.meter.refusal(m.planner->budget(), m.planner->weights_min(), k, m.info.layers[k].name));
      abort();
      throw why;
    }
    abort();
    throw;
  }
}

c10::IValue Executor::finish() {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  if (!m.run || m.cur < static_cast<int>(m.w.plan.blocks.size())) {
    throw Error(m.path + ": finish() before every block has run");
  }
  c10::IValue out;
  try {
    AccountScope charge(m.meter.measuring() ? m.meter.account() : m.lender.lends() ? m.lender.account() : 0);
    out = m.sk.finish(*m.run);
    // Outputs copied out of [lo, hi) (outside any account); the bytes copied.
    auto evict = [&](const char* lo, std::uint64_t bytes) {
      const int before = set_thread_cpu_account(0);
      struct Restore {
        int a;
        ~Restore() { set_thread_cpu_account(a); }
      } restore{before};
      std::uint64_t copied = 0;
      out = evict_from(out, lo, lo + bytes, &copied);
      return copied;
    };
    if (const auto [base, bytes] = m.meter.scratch(); bytes != 0) {
      // Note [Dynamic shapes]: outputs leave the scratch zone, which goes after this inference.
      m.meter.note_reach();
      (void)evict(base, bytes);
    }
    if (m.lender.lends()) {
      // Note [Lending the activation reserve]: outputs the caller keeps would hold zone bytes
      // the next inference's activations (or blocks) are planned to use: copied out, the zone's
      // chunks freed with the inference.
      const std::uint64_t copied = evict(m.w.ring->zone_begin(), m.w.ring->lend());
      m.lender.outputs_copied(copied);
    }
    // Blocks read after a write into the file would be mixed with those read before it.
    m.reader->check_file().throw_if_error();
  } catch (...) {
    abort();
    throw;
  }
  m.run.reset();
  trace_span(m.tgroup, TraceLane::kInference, "inference", m.counters.inferences++, m.inference_t0, TraceClock::now());
  // Note [Lending the activation reserve]: one whole inference in this zone measured every
  // layer's reach.
  m.lender.end_inference();
  // Reads ahead of this inference belong to the next one now.
  m.cursor->inference_done();
  m.cur = 0;
  m.register_ring();
  m.pump();
  const bool measured_input = m.meter.measuring();
  end_measuring(m, true);  // re-plans with the reserve this input needs
  try {
    // Note [Timing layers on the GPU]: the learner sees the inference whole. One that measured
    // its input is not learned from (learn_costs): its times are dropped, not waited for.
    if (learns(m) && measured_input) m.backend->forget_layer_times();
    else if (learns(m)) take_layer_times(m, true);
    learn_costs(m, !measured_input);
  } catch (const std::exception& e) {  // never this inference's failure: the plan in force stays
    log(LogLevel::kWarn, m.path + ": learning the costs failed, the plan stays: " + e.what());
  }
  return out;
}

void Executor::abort() {
  Impl& m = *impl_;
  std::lock_guard<std::recursive_mutex> lk(m.mu);
  m.cursor->cancel_executing();  // before it is forgotten: its pieces may be in flight
  m.backend->forget_layer_times();
  m.run.reset();
  m.bound = false;
  m.cursor->done_executing();
  m.cur = 0;
  m.yield.store(false);
  if (m.released) {
    end_measuring(m, false);
    return;
  }
  // Nothing half-read stays: reads cancelled and waited for, the ring emptied, swapped views
  // dropped; resident blocks read whole and pinned slots stay bound.
  try {
    m.drain();
    m.backend->idle(m.w.ring.get());
  } catch (const std::exception& e) {  // keep the first error; the GPU's is logged
    log(LogLevel::kError, m.path + ": waiting for the GPU after an error failed: " + e.what());
  }
  m.sk.unbind_layers(0, static_cast<int>(m.info.layers.size()) - 1);
  m.bind_loaded();
  end_measuring(m, false);
}

bool Executor::in_inference() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->run != nullptr;
}
int Executor::next_layer() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  return impl_->run ? impl_->run->next_layer() : 0;
}
void Executor::interrupt() { impl_->yield.store(true); }
namespace {
// Executor::next_block_unread_bytes with the executor's lock held; `wait`: block on the reader's.
bool next_unread_locked(const Executor::Impl& m, bool wait, std::uint64_t* out);
}  // namespace
std::uint64_t Executor::next_block_unread_bytes() const {
  std::lock_guard<std::recursive_mutex> lk(impl_->mu);
  std::uint64_t n = 0;
  next_unread_locked(*impl_, true, &n);
  return n;
}
bool Executor::try_next_block_unread_bytes(std::uint64_t* out) const {
  std::unique_lock<std::recursive_mutex> lk(impl_->mu, std::try_to_lock);
  return lk.owns_lock() && next_unread_locked(*impl_, false, out);
}
namespace {
bool next_unread_locked(const Executor::Impl& m, bool wait, std::uint64_t* out) {
  const int b = m.run ? m.cur : 0;
  if (m.released || b >= static_cast<int>(m.w.plan.blocks.size())) {
    *out = 0;
    return true;
  }
  // After shed() the block's bytes are gone: the next step re-plans and reads them again.
  if (m.shed_pending) {
    *out = m.w.plan.block_bytes[b];
    return true;
  }
  if (m.bound || (m.w.plan.resident[b] && m.w.kept_state[b] == Weights::Kept::kLoaded)) {
    *out = 0;
    return true;
  }
  return m.cursor->unlanded_of(b, wait, out);
}
}  // namespace

c10::IValue Executor::forward(std::vector<c10::IValue> inputs) {
  begin(std::move(inputs));
  while (!step()) {
  }
  return finish();
}


}  // namespace swapnet
