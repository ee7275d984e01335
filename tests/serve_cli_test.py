#!/usr/bin/python3
"""`swapnet serve` and `swapnet ctl` end to end on two small models: a short scenario with a
budget schedule runs (every output bit-identical to direct inference, no model over its budget,
each change in effect, the --json fields the issue names, a --timeline CSV, a --trace); deadlines under lst;
a periodic group under heft at a load (makespan, QoE and score; --slo-scale, --load); `ctl budget` moves a
running serve and `ctl status` reports it; malformed scenarios are refused naming the field;
a scenario whose minimums do not fit is refused with the numbers.

  serve_cli_test.py SWAPNET_CLI RESNET18.pt MOBILENET_V2.pt WORKDIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from cli_test_util import Checks, run, test_env


def main() -> int:
    cli, r18, mv2, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    checks = Checks()
    expect = checks.expect
    for pt in (r18, mv2):
        img = os.path.join(work, os.path.basename(pt).replace(".pt", ".swapnet"))
        rc, _, err = run(cli, "pack", pt, "-o", img, "--input-shape", "1,3,64,64")
        if rc != 0:
            print(err, file=sys.stderr)
            return 1

    def scenario(name, **fields):
        s = {"name": name, "total_budget": "70%", "duration_s": 4,
             "models": [{"name": "r18", "image": "resnet18.swapnet", "urgency": 2},
                        {"name": "mv2", "image": "mobilenet_v2.swapnet"}]}
        s.update(fields)
        path = os.path.join(work, name + ".json")
        with open(path, "w") as f:
            json.dump(s, f)
        return path

    # A run with the budget cut and restored.
    path = scenario("cuts", duration_s=2.5, schedule=[{"at_s": 0.8, "budget": "55%"}, {"at_s": 1.6, "budget": "90%"}])
    timeline = os.path.join(work, "timeline.csv")
    trace = os.path.join(work, "trace.json")
    rc, out, err = run(cli, "serve", path, "--json", "--socket", "none", "--timeline", timeline, "--trace", trace)
    expect(rc == 0, f"serve exit {rc}: {err}")
    if rc == 0:
        j = json.loads(out)
        for k in ("total_budget_bytes", "models", "adaptations"):
            expect(k in j, f"--json has no {k}")
        for m in j["models"]:
            for k in ("name", "budget_bytes", "peak_model_bytes", "latency_ms", "requests", "equal"):
                expect(k in m, f"model has no {k}")
            expect(m["equal"] is True, f"{m['name']}: outputs differ: {m.get('difference')}")
            expect(m["over_budget"] == 0, f"{m['name']}: over its budget")
            expect(m["requests"] >= 3, f"{m['name']}: only {m['requests']} requests")
            expect(m["latency_ms"]["median"] > 0 and m["latency_ms"]["p90"] >= m["latency_ms"]["median"],
                   f"{m['name']}: latency {m['latency_ms']}")
            expect(m["peak_model_bytes"] <= m["full_bytes"], f"{m['name']}: peak above the whole model")
        a = j["adaptations"]
        expect(len(a) == 2 and all(x["took_ms"] >= 0 for x in a), f"adaptations {a}")
        # Note [The memory ledger]: never above the budget in force, a peak measured.
        mem = j["memory"]
        expect(mem["over_byte_s"] == 0 and mem["peak_bytes"] > 0, f"memory ledger {mem}")
        expect(a and a[0]["budget_bytes"] < j["initial_budget_bytes"], "the first change cuts the budget")
        expect(sum(j["models"][i]["budget_bytes"] for i in range(2)) <= j["total_budget_bytes"], "budgets sum")
        print(json.dumps({"models": [{k: m[k] for k in ("name", "budget_bytes", "blocks", "latency_ms", "requests")}
                                     for m in j["models"]], "adaptations": [(x["at_s"], x["took_ms"]) for x in a]}))
        with open(timeline) as f:
            lines = f.read().splitlines()
        expect(lines[0] == "t_s,model,latency_ms,total_budget_bytes" and len(lines) > 6, "timeline CSV")
        # --trace: both models' timelines, each in its own group, the two cuts on the control lane.
        with open(trace) as f:
            t = json.load(f)
        groups = {e["args"]["name"] for e in t["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
        expect({"resnet18.swapnet", "mobilenet_v2.swapnet"} <= groups, f"trace groups {groups}")
        cuts = [e for e in t["traceEvents"] if e["ph"] == "i" and e["name"] == "total budget"]
        layers = sum(1 for e in t["traceEvents"] if e["ph"] == "X" and e["name"].startswith("layer "))
        expect(len(cuts) == 2 and layers > 100, f"trace: {len(cuts)} budget changes, {layers} layers")

    # --learn 3 (Note [Learning the costs in service]); whether a model
    # re-plans depends on this machine's profile, so only that every model checked its costs, that
    # a learned plan split the total again when there was one, and the usual promises. A window
    # spans 1 s at least, longer while its inferences differ much (Note [Noise in the window]), and
    # under load (ctest -j2 beside tsan) 2 s left mobilenet_v2 without one: 5 s.
    rc, out, err = run(cli, "serve", scenario("learn", duration_s=5), "--json", "--socket", "none", "--learn", "3")
    expect(rc == 0, f"serve --learn exit {rc}: {err}")
    if rc == 0:
        j = json.loads(out)
        # Costs taken, the grid's plan put in force or the plan in force kept (Note [A re-plan must
        # gain]): either way the total is split again with the model's new curve.
        def followed(m):
            return m["learned_plans"] + m["learn_kept_plans"]
        learned = sum(followed(m) for m in j["models"])
        for m in j["models"]:
            expect(m["equal"] is True and m["over_budget"] == 0, f"--learn {m['name']}: equal / within budget")
            # An inference that overlapped another model's grid rebuild does not count: on a
            # loaded 2-core CI machine mobilenet_v2 re-planned 4 times in the 2 s and resnet18
            # finished no window. A model without one needs another's learned plans to explain it.
            others = learned - followed(m)
            expect(m["learn_windows"] >= 1 or others > 0,
                   f"--learn {m['name']}: {m['learn_windows']} windows, other models' learned plans {others}")
        expect(sum(m["learn_windows"] for m in j["models"]) >= 1, "--learn: no model checked its costs")
        notes = [a["note"] for a in j["adaptations"] if "costs learned" in a["note"]]
        expect(len(notes) <= learned, f"--learn: {len(notes)} splits for {learned} learned plans (in force or kept)")
        print(f"serve --learn 3: learned plans (in force or kept) {learned}, splits {len(notes)}")
    # --learn-store DIR (Note [Learned costs kept]): each model's learned costs in DIR/NAME.learned.json;
    # needs --learn and a directory.
    store = os.path.join(work, "learned")
    shutil.rmtree(store, ignore_errors=True)  # a file a run before this one stored is not this run's
    os.makedirs(store, exist_ok=True)
    rc, out, err = run(cli, "serve", scenario("learn_store", duration_s=2), "--json", "--socket", "none", "--learn", "3",
                       "--learn-store", store)
    expect(rc == 0, f"serve --learn-store exit {rc}: {err}")
    if rc == 0:
        for m in json.loads(out)["models"]:
            kept = os.path.exists(os.path.join(store, m["name"] + ".learned.json"))
            plans = m["learned_plans"] + m["learn_kept_plans"]
            expect(kept == (m["learn_stored"] > 0) and m["learn_stored"] <= plans + 1,
                   f"--learn-store {m['name']}: stored {m['learn_stored']}, file {kept}, learned plans (in force or kept) {plans}")
    rc, _, err = run(cli, "serve", scenario("learn_store_alone", duration_s=1), "--socket", "none", "--learn-store", store)
    expect(rc != 0 and "needs --learn" in err, f"serve --learn-store without --learn: rc {rc}: {err!r}")
    rc, _, err = run(cli, "serve", scenario("learn_store_file", duration_s=1), "--socket", "none", "--learn", "3",
                     "--learn-store", path)
    expect(rc != 0 and "not a directory" in err, f"serve --learn-store FILE: rc {rc}: {err!r}")
    rc, _, err = run(cli, "serve", scenario("learn_bad", duration_s=1), "--socket", "none", "--learn", "-1")
    expect(rc != 0 and "--learn" in err, f"serve --learn -1: rc {rc}: {err!r}")
    rc, _, err = run(cli, "serve", scenario("learn_one", duration_s=1), "--socket", "none", "--learn", "1")
    expect(rc != 0 and "learn_after 1 is not 0 (never) or 3..1000" in err, f"serve --learn 1: rc {rc}: {err!r}")

    # Open-loop arrivals with deadlines under the central scheduler (lst).
    path = scenario("slo", scheduler="lst", workers=1, duration_s=2.5,
                    models=[{"name": "r18", "image": "resnet18.swapnet", "period_ms": 40, "jitter_ms": 4, "slo_ms": 60},
                            {"name": "mv2", "image": "mobilenet_v2.swapnet", "period_ms": 50, "slo_ms": 2}])
    for sched in ("lst", "lst+io"):  # and its disk-aware variant
        rc, out, err = run(cli, "serve", path, "--json", "--socket", "none", "--scheduler", sched)
        expect(rc == 0, f"serve slo {sched} exit {rc}: {err}")
        if rc != 0:
            continue
        j = json.loads(out)
        expect(j["scheduler"] == sched and 0 <= j["slo_met"] <= 1, f"slo run: {j.get('scheduler')} {j.get('slo_met')}")
        r18, mv2 = j["models"]
        expect(r18["deadline_requests"] + r18["unanswered"] >= 30, f"{sched}: r18 open-loop arrivals: {r18['deadline_requests']}")
        expect(mv2["dropped"] > 0 and mv2["slo_met"] < 0.5,
               f"{sched}: mv2's 2 ms deadline cannot be met: {mv2['slo_met']}, dropped {mv2['dropped']}")
        expect(all(m["equal"] and m["over_budget"] == 0 for m in j["models"]), f"{sched}: slo run outputs and budgets")
        expect(j["dispatch_us"] > 0, "dispatch time measured")

    # Note [Serve's defaults]: periods and deadlines only: lst, one worker with every core as its
    # intra-op threads, said on stderr; --workers overrides (the cores over the workers).
    cores = len(os.sched_getaffinity(0))
    path = scenario("slo_defaults", duration_s=1,  # what serve chose and said, not what it served
                    models=[{"name": "r18", "image": "resnet18.swapnet", "period_ms": 40, "slo_ms": 80},
                            {"name": "mv2", "image": "mobilenet_v2.swapnet", "period_ms": 50, "slo_ms": 80}])
    rc, out, err = run(cli, "serve", path, "--json", "--socket", "none", "--no-check")
    expect(rc == 0, f"serve slo_defaults exit {rc}: {err}")
    if rc == 0:
        j = json.loads(out)
        expect(j["scheduler"] == "lst" and j["workers"] == 1 and all(m["threads"] == cores for m in j["models"]),
               f"defaults: scheduler {j['scheduler']}, workers {j['workers']} (cores {cores}), "
               f"threads {[m['threads'] for m in j['models']]}")
        expect("serve chose scheduler lst" in err and f"1 worker (a block at a time, on all {cores} cores)" in err,
               f"defaults said: {err!r}")
    rc, out, err = run(cli, "serve", path, "--json", "--socket", "none", "--no-check", "--workers", "2", "--duration", "1")
    j = json.loads(out) if rc == 0 else {}
    expect(rc == 0 and j["workers"] == 2 and all(m["threads"] == max(1, cores // 2) for m in j["models"])
           and "1 worker" not in err, f"--workers 2: rc {rc}: {err!r}")
    # --threads is the user's word for every model the scenario gives no threads (it once only
    # set the device profile's threads while the models ran on the cores over the workers).
    rc, out, err = run(cli, "serve", path, "--json", "--socket", "none", "--no-check", "--threads", "1", "--duration", "1")
    j = json.loads(out) if rc == 0 else {}
    expect(rc == 0 and all(m["threads"] == 1 for m in j["models"])
           and "1 intra-op thread(s) per model (--threads)" in err, f"--threads 1: rc {rc}: {j.get('models')} {err!r}")

    # Note [The driver sleeps]: a run that goes on past its duration for its minimum of requests
    # does not spin serve's own thread meanwhile (it once took a core of the runtime's).
    path = scenario("min_requests", duration_s=0.5, warmup_s=0, min_requests=5,
                    models=[{"name": "r18", "image": "resnet18.swapnet", "period_ms": 400, "slo_ms": 400},
                            {"name": "mv2", "image": "mobilenet_v2.swapnet", "period_ms": 400, "slo_ms": 400}])
    rc, out, err = run(cli, "serve", path, "--json", "--socket", "none", "--no-check")
    j = json.loads(out) if rc == 0 else {}
    past = j.get("duration_s", 0) - 0.5
    expect(rc == 0 and past > 1 and all(m["deadline_requests"] + m["unanswered"] >= 5 for m in j["models"]),
           f"min_requests: rc {rc}, ended {past:.2f} s past the duration: {err!r}")
    expect(rc == 0 and 0 <= j.get("driver_cpu_s", float("inf")) < 0.2 * past,
           f"serve's driver used {j.get('driver_cpu_s')} s of CPU in a run that ended {past:.2f} s past its duration")

    # Note [Load and run rules]: --load scales the periods to the machine (direct latencies
    # measured first, said on stderr), a warm-up not counted; Note [Budget traces]: a sawtooth of
    # cuts, the ledger never above the budget in force.
    path = scenario("load_saw", duration_s=3, warmup_s=1, total_budget="90%",
                    models=[{"name": "r18", "image": "resnet18.swapnet", "period_ms": 40, "slo_ms": 40},
                            {"name": "mv2", "image": "mobilenet_v2.swapnet", "period_ms": 20, "slo_ms": 40}],
                    budget_trace={"sawtooth": {"high": "90%", "low": "60%", "period_s": 1, "steps": 2}})
    rc, out, err = run(cli, "serve", path, "--json", "--socket", "none", "--load", "0.5")
    expect(rc == 0, f"serve load_saw exit {rc}: {err}")
    if rc == 0:
        j = json.loads(out)
        load = j["load"]
        expect(load and load["target"] == 0.5 and all(v > 0 for v in load["direct_ms"].values()), f"load {load}")
        expect("measured direct latencies" in err and "load 0.50" in err, f"load said: {err!r}")
        if load:
            # The periods keep their 2:1 ratio, scaled to the load; deadlines with them.
            r18, mv2 = j["models"]
            expect(abs(r18["period_ms"] / mv2["period_ms"] - 2) < 1e-6 and abs(r18["period_ms"] - 40 * load["scale"]) < 1e-6,
                   f"scaled periods {r18['period_ms']} {mv2['period_ms']} (x{load['scale']})")
            expect(abs(r18["slo_ms"] - r18["period_ms"]) < 1e-6, f"deadline {r18['slo_ms']} with its period")
        expect(j["warmup_s"] == 1 and all(m["counted_requests"] < m["deadline_requests"] + m["unanswered"] for m in j["models"]),
               f"warm-up not counted: {[(m['counted_requests'], m['deadline_requests']) for m in j['models']]}")
        expect(all(m["equal"] and m["over_budget"] == 0 for m in j["models"]), "load_saw outputs and budgets")
        expect(len(j["adaptations"]) >= 4 and j["memory"]["over_byte_s"] == 0,
               f"sawtooth: {len(j['adaptations'])} changes, memory {j['memory']}")
        # A request's score is at most 1 and 0 when missed, so per model score <= slo_met. The
        # scenario's score is the mean over the models, its slo_met pooled over their requests:
        # the score is bounded by the models' mean slo_met, not by the pooled one (a model with
        # 1 of 1 met beside one with 0 of 2: score 0.5, slo_met 1/3).
        met = [m for m in j["models"] if m["slo_met"] is not None]
        expect(len(met) == len(j["models"]), f"every model has counted requests: {[m['slo_met'] for m in j['models']]}")
        for m in met:
            expect(0 <= m["xrbench_score"] <= m["slo_met"] <= 1, f"{m['name']}: xrbench {m['xrbench_score']} slo {m['slo_met']}")
        mean_met = sum(m["slo_met"] for m in met) / max(1, len(met))
        expect(0 <= j["xrbench_score"] <= mean_met + 1e-9 and 0 <= j["slo_met"] <= 1,
               f"xrbench {j['xrbench_score']} over the models' mean slo_met {mean_met} (pooled {j['slo_met']})")
    # Note [A load that counts the disk]: on a slow disk (emulated at 100 MB/s, far below this
    # machine's) a swapped model's period counts the bytes its budget leaves to read, not only
    # its direct latency: the period is that bound over the load.
    path = scenario("load_disk", duration_s=1, warmup_s=0, total_budget="80%",
                    models=[{"name": "r18", "image": "resnet18.swapnet", "period_ms": 40}])
    rc, out, err = run(cli, "serve", path, "--json", "--socket", "none", "--no-check", "--load", "0.5",
                       env={"SWAPNET_EMULATE_READ": "100MB/s"})
    expect(rc == 0, f"serve load_disk exit {rc}: {err}")
    if rc == 0:
        j = json.loads(out)
        load, r18 = j["load"], j["models"][0]
        direct, bound, counted = (load[k]["r18"] for k in ("direct_ms", "bound_ms", "counted_ms"))
        expect(abs(load["read_mb_s"] - 100) < 1e-6 and bound > direct and counted == bound
               and abs(r18["period_ms"] - counted / 0.5) < 1e-3 and "(100 MB/s)" in err,
               f"the disk counted: {load}, period {r18['period_ms']}: {err!r}")
    for fields, want in (({"load": 0}, "field 'load'"), ({"warmup_s": -1}, "field 'warmup_s'"),
                         ({"budget_trace": {"sawtooth": {"high": "90%"}}}, "budget_trace.sawtooth"),
                         ({"budget_trace": {"replay": "missing.csv"}}, "cannot read"),
                         ({"budget_trace": {"square": 1}}, "field 'budget_trace'")):
        rc, _, err = run(cli, "serve", scenario("bad_rules", **fields), "--socket", "none")
        expect(rc != 0 and want in err, f"serve {fields}: rc {rc}: {err!r}")
    with open(os.path.join(work, "pressure.csv"), "w") as f:
        f.write("t_s,budget\n0.5,60%\nlater,70%\n")
    rc, _, err = run(cli, "serve", scenario("bad_replay", budget_trace={"replay": "pressure.csv"}), "--socket", "none")
    expect(rc != 0 and "pressure.csv:3" in err, f"serve replay with a bad line: rc {rc}: {err!r}")

    # A periodic group (Puzzle): both models get every frame; makespan, QoE and score per group,
    # under Band's HEFT. The deadline generous, then impossible (--slo-scale), then half the load.
    # The period is set by "load" from the direct latencies measured at start, with room for
    # what starts beside it: a fixed 100 ms overloaded a fresh clone's first ctest minutes
    # (resnet18 took 84 ms there, not ~20, and the frames queued to a 1.9 s makespan), and so
    # did load 0.4 once, measured before the tests beside it started (1.2 s makespan).
    path = scenario("group", scheduler="heft", workers=1, duration_s=2.5, load=0.2,
                    models=[{"name": "r18", "image": "resnet18.swapnet"}, {"name": "mv2", "image": "mobilenet_v2.swapnet"}],
                    groups=[{"name": "cam", "models": ["r18", "mv2"], "period_ms": 100, "slo_ms": 1500}])
    frames = {}
    # The impossible deadline needs no count of frames, only that none is met: 1.2 s of it.
    for tag, extra in (("generous", []), ("impossible", ["--slo-scale", "0.0005", "--duration", "1.2"]),
                       ("half load", ["--load", "0.1"])):
        rc, out, err = run(cli, "serve", path, "--json", "--socket", "none", *extra)
        expect(rc == 0, f"serve group {tag} exit {rc}: {err}")
        if rc != 0:
            continue
        j = json.loads(out)
        g = j["groups"][0] if j.get("groups") else {}
        expect(g.get("name") == "cam" and g.get("models") == ["r18", "mv2"], f"group {tag}: {g}")
        if not g:
            continue
        frames[tag] = (g["frames"], g["period_ms"])
        expect(j["scheduler"] == "heft", f"group {tag}: scheduler {j['scheduler']}")
        expect(0 < g["complete"] <= g["frames"], f"group {tag}: {g['complete']} of {g['frames']} frames complete")
        expect(all(m["group"] == "cam" and m["equal"] and m["over_budget"] == 0 for m in j["models"]),
               f"group {tag}: members' outputs and budgets")
        # A frame's makespan is at least each member's latency: the median makespan is at least
        # the larger median latency.
        expect(g["makespan_ms"]["median"] >= max(m["latency_ms"]["median"] for m in j["models"]) - 1e-6,
               f"group {tag}: makespan {g['makespan_ms']} below a member's latency")
        expect(0 <= g["score"] <= g["qoe"] <= 1 and j["score"] == g["score"], f"group {tag}: qoe {g['qoe']} score {g['score']}")
        if tag == "generous":
            expect(g["qoe"] >= 0.8 and g["score"] >= 0.75, f"group: a 1.5 s deadline at 100 ms frames: qoe {g['qoe']} score {g['score']}")
        if tag == "impossible":
            expect(g["qoe"] == 0 and g["score"] < 0.01, f"group: a 0.75 ms deadline cannot be met: qoe {g['qoe']} score {g['score']}")
        print(json.dumps({"group": tag, **{k: g[k] for k in ("frames", "complete", "makespan_ms", "qoe", "score")}}))
    for tag, (n, period) in frames.items():
        # The run's length over the period in frames, less the warm-up's (two periods). Each run
        # measures the latencies again, beside whatever else runs then: each at its own period.
        ms = 1200 if tag == "impossible" else 2500
        expect(0.6 * ms / period - 2 <= n <= ms / period + 1, f"group {tag}: {n} frames at a {period:.0f} ms period")

    # ctl against a running serve.
    sock = os.path.join(work, "ctl", "serve.sock")
    path = scenario("ctl", duration_s=60)  # ended by SIGTERM when the ctl checks are done
    p = subprocess.Popen([cli, "serve", path, "--json", "--socket", sock], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=test_env(cli))
    for _ in range(200):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    expect(os.path.exists(sock) and (os.stat(sock).st_mode & 0o777) == 0o600, "socket is owner-only")
    rc, out, err = run(cli, "ctl", "--socket", sock, "budget", "30MiB")
    expect(rc == 0 and out.strip() == f"ok {30 << 20}", f"ctl budget: {rc} {out!r} {err!r}")
    rc, out, err = run(cli, "ctl", "--socket", sock, "status")
    expect(rc == 0 and json.loads(out)["total_budget_bytes"] == 30 << 20, f"ctl status: {out!r}")
    rc, out, err = run(cli, "ctl", "--socket", sock, "budget", "lots")
    expect(rc == 2 and out.startswith("error:"), f"ctl bad size: {rc} {out!r}")
    # `swapnet ctl` answers without loading libtorch (cli/launcher.cpp): the launcher links none,
    # and a status round trip, process start included, takes milliseconds (the issue: <= 100 ms;
    # the full CLI needs ~900 ms only to load libtorch). The median of five, for a loaded machine.
    ldd = subprocess.run(["ldd", cli], capture_output=True, text=True).stdout.split("\n")
    heavy = [l.split()[0] for l in ldd if any(k in l for k in ("libtorch", "libc10", "libswapnet"))]
    expect(not heavy, f"the launcher {cli} links {heavy}")
    took = []
    for _ in range(5):
        t0 = time.monotonic()
        rc, out, err = run(cli, "ctl", "--socket", sock, "status")
        took.append((time.monotonic() - t0) * 1e3)
        expect(rc == 0 and "total_budget_bytes" in out, f"ctl status: {rc} {out!r} {err!r}")
    took.sort()
    print(f"ctl status: {', '.join(f'{t:.1f}' for t in took)} ms")
    expect(took[2] <= 100, f"ctl status median {took[2]:.1f} ms > 100 ms")
    rc, out, err = run(cli, "ctl", "--help")
    expect(rc == 0 and "budget SIZE | status" in out, f"ctl --help: {rc} {out!r}")
    rc, out, err = run(cli, "ctl", "--socket", sock, "--frobnicate", "status")
    expect(rc == 2 and "unknown option '--frobnicate'" in err, f"ctl bad option: {rc} {err!r}")
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    expect(p.returncode == 0, f"serve under ctl exit {p.returncode}: {err}")
    if p.returncode == 0:
        j = json.loads(out)
        expect(j["total_budget_bytes"] == 30 << 20, "the ctl budget is the serve's total")
        expect(any(a["budget_bytes"] == 30 << 20 and a["took_ms"] >= 0 for a in j["adaptations"]), "ctl adaptation")
        expect(all(m["equal"] and m["over_budget"] == 0 for m in j["models"]), "ctl run outputs and budgets")
    rc, out, err = run(cli, "ctl", "--socket", sock, "status")
    expect(rc == 2 and "no swapnet serve answers there" in err, f"ctl without serve: {err!r}")

    # Refusals, each naming what is wrong.
    bad = {
        "nomodels": ({"models": []}, "field 'models' must be a non-empty array"),
        "unknown": ({"budget": "1GiB"}, "field 'budget' is not a scenario field"),
        "noimage": ({"models": [{"name": "x", "image": "nope.swapnet"}]}, "field 'models[0].image': 'nope.swapnet' is neither in"),
        "urgency": ({"models": [{"image": "resnet18.swapnet", "urgency": 0}]}, "field 'models[0].urgency': 0.000000 must be > 0"),
        "device": ({"models": [{"image": "resnet18.swapnet", "device": "tpu"}]}, "field 'models[0].device': 'tpu' is not cpu or cuda"),
        "twice": ({"models": [{"image": "resnet18.swapnet"}, {"image": "resnet18.swapnet"}]}, "'resnet18.swapnet' is used twice"),
        "schedule": ({"schedule": [{"at": 1}]}, "field 'schedule[0]' must be {\"at_s\": SECONDS, \"budget\": SIZE}"),
        "percent": ({"total_budget": "x%"}, "field 'total_budget': 'x%' is not a percentage"),
        "policy": ({"policy": "fastest"}, "'fastest' is not one of paper, equal, minmax"),
        "scheduler": ({"scheduler": "edf9"}, "scheduler 'edf9' is not one of threads, fifo, rr, sel, lst"),
        "jitter": ({"models": [{"image": "resnet18.swapnet", "period_ms": 10, "jitter_ms": 10}]},
                   "field 'models[0].jitter_ms': 10.000000 must be >= 0 and below period_ms"),
        "workers": ({"workers": 0}, "field 'workers': 0 is not an integer in 1..1024"),
        # JSON reads this as a float, which no int holds (found by fuzz.scenario).
        "workers_huge": ({"workers": 184467440737095516160}, "field 'workers': 1.844674407370955e+20 is not an integer in 1..1024"),
        "threads": ({"models": [{"image": "resnet18.swapnet", "threads": 1.5}]},
                    "field 'models[0].threads': 1.5 is not an integer in 0..1024"),
        "groupmodel": ({"groups": [{"models": ["r18", "yolo"], "period_ms": 50}]},
                       "field 'groups[0].models': 'yolo' is not a model of the scenario"),
        "grouprepeat": ({"groups": [{"models": ["r18", "r18"], "period_ms": 50}]}, "field 'groups[0].models': 'r18' is listed twice"),
        "groupperiod": ({"groups": [{"models": ["r18"]}]}, "field 'groups[0].period_ms' must be a number > 0"),
        "grouptwice": ({"groups": [{"models": ["r18"], "period_ms": 50}, {"name": "b", "models": ["r18"], "period_ms": 50}]},
                       "field 'groups[1].models': 'r18' is already in group 'group0'"),
        "groupown": ({"models": [{"name": "r18", "image": "resnet18.swapnet", "period_ms": 30}],
                      "groups": [{"models": ["r18"], "period_ms": 50}]},
                     "'r18' has its own period_ms, rate_hz or slo_ms; a group member takes the group's"),
        "cannotfit": ({"total_budget": "1MiB"}, "the scenario cannot fit: the models' minimum budgets sum to"),
    }
    for name, (fields, message) in bad.items():
        rc, out, err = run(cli, "serve", scenario(name, **fields), "--socket", "none")
        expect(rc == 2 and message in err, f"{name}: exit {rc}, {err.strip()!r} lacks {message!r}")
    # A model on the GPU: where none is usable, an error naming the scenario and the model, not
    # PyTorch's backend dump (which serve printed before); where one is, served bit-identical to
    # direct GPU inference (its check moves the inputs to the GPU, as the executor does).
    rc, out, _ = run(cli, "info", "--json")
    gpu = rc == 0 and json.loads(out).get("cuda_usable") is True
    path = scenario("gpu", models=[{"name": "r18", "image": "resnet18.swapnet", "device": "cuda"},
                                   {"name": "mv2", "image": "mobilenet_v2.swapnet"}])
    rc, out, err = run(cli, "serve", path, "--socket", "none", "--json")
    if gpu:
        expect(rc == 0, f"serve with a model on the GPU: exit {rc}: {err}")
        if rc == 0:
            for m in json.loads(out)["models"]:
                expect(m["equal"] is True and m["over_budget"] == 0 and m["requests"] >= 3,
                       f"{m['name']} ({m['device']}): equal {m['equal']}, over {m['over_budget']}, {m['requests']} requests")
    else:
        expect(rc == 2 and "gpu.json: model 'r18' (" in err and "--device cuda:" in err and "Could not run" not in err,
               f"serve with a model on the GPU, none usable: exit {rc}, {err.strip()[:300]!r}")
    with open(os.path.join(work, "broken.json"), "w") as f:
        f.write("{\"models\": [")
    rc, out, err = run(cli, "serve", scenario("scale"), "--period-scale", "0", "--socket", "none")
    expect(rc != 0 and "--period-scale" in err, f"--period-scale 0: {rc} {err.strip()!r}")
    rc, out, err = run(cli, "serve", os.path.join(work, "broken.json"))
    expect(rc == 2 and "broken.json: not valid JSON" in err, f"broken JSON: {err!r}")
    return checks.exit_status("serve")


if __name__ == "__main__":
    sys.exit(main())
