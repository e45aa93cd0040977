"""The readable tables of the runtime's commands: ``shoal train`` (and ``--elastic``), and
``shoal profile``. Each reads the JSON document the command prints with ``--json``."""

from __future__ import annotations

from shoal.report.tables import Table, seconds


def trained_table(doc: dict) -> Table:
    t = Table(f"Trained {doc['steps']} steps on {doc['world_size']} processes ({doc['backend']}, "
              f"{doc['device']}, {doc['precision']})", ["metric", "value"], left=("metric",))
    t.add_row("final loss", f"{doc['final_loss']:.5f}")
    t.add_row("mean step time", seconds(doc["step_time_s"]))
    pred = doc["predicted"]["iteration_time_s"]
    t.add_row("predicted step time (stack shoal)",
              f"{seconds(pred)} (measured {doc['measured_over_predicted']:.2f}x)" if pred
              else f"none ({doc['predicted']['why_none']})")
    t.add_row("tokens per iteration", f"{doc['tokens_per_iteration']:,}")
    t.add_row("tokens/s", f"{doc['tokens_per_iteration'] / doc['step_time_s']:,.0f}")
    t.add_row("MFU", f"{doc['mfu']:.2%}" if doc["mfu"] else "—")
    return t


def step_line(d: dict) -> str:
    """One training step as it happens."""
    return (f"step {d['step']}: loss {d['loss']:.4f}, {d['step_time_s']:.3f} s, "
            f"{d['tokens_per_s']:,.0f} tokens/s, MFU {d['mfu']:.1%}")


def elastic_event_line(kind: str, d: dict) -> str:
    """One step or one reconfiguration of an elastic run, as it happens."""
    if kind == "step":
        return f"step {d['step']}: loss {d['loss']:.4f}, {d['step_time_s']:.3f} s"
    if d.get("decision", "switch") == "switch":
        return (f"{seconds(d['time_s'])}: {d['cause']}: plan {d['new_plan']} on workers "
                f"{d['members']}, from step {d['resumed_from_step']}")
    return f"{seconds(d['time_s'])}: {d['cause']}: plan kept ({d['decision']})"


def elastic_table(doc: dict) -> Table:
    """The reconfigurations of an elastic run: when, why, the plan and what it cost."""
    t = Table(f"Trained to step {doc['steps']}, elastic", ["time", "cause", "plan", "from step",
                                                        "steps lost", "to first step"],
              left=("cause", "plan"))
    for r in doc["reconfigurations"]:
        if r.get("decision", "switch") != "switch":
            t.add_row(seconds(r["time_s"]), r["cause"], f"kept ({r['decision']})", "—", "0", "—")
            continue
        t.add_row(seconds(r["time_s"]), r["cause"], r["new_plan"], str(r["resumed_from_step"]),
                  str(r["steps_lost"]),
                  seconds(r["detect_to_first_step_s"]) if r["detect_to_first_step_s"] else "—")
    return t


def profile_table(doc: dict, model: str, device: str, procs: int) -> Table:
    """Per TP degree and microbatch size of a profile file: the model's layer times summed."""
    t = Table(f"Profile of {model} on {procs} {device} processes", ["TP", "mbs", "forward",
                                                                    "backward", "update"])
    for tp, per in doc["gpus"][device].items():
        for m, rows in per.items():
            t.add_row(tp, m, seconds(sum(r[0] for r in rows)), seconds(sum(r[1] for r in rows)),
                      seconds(sum(r[2] for r in rows)))
    return t


def link_line(link: dict) -> str:
    return (f"link: {link['bandwidth_Bps'] / 1e9:.2f} GB/s, {link['latency_s'] * 1e6:.0f} us "
            "latency (point to point)")
