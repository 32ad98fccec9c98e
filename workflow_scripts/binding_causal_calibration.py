"""Rule causal_calibration: the recorded pilot of the JER regulariser's strength per base."""

from repdiag.core.runtime import script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    import pandas as pd

    from repdiag.common.tables import write_csv
    from repdiag.encoders.zoo.calibrate import PilotSettings, calibration_summary, pilot

    settings = PilotSettings.from_config(snakemake.params.calibration)
    frames = []
    for spec in snakemake.params.specs:
        log.info("pilot of %s: every %d steps of its plain trajectory", spec["run"], settings.every)
        frames.append(pilot(spec, settings))
    steps = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    summary = calibration_summary(steps, settings) if frames else pd.DataFrame()
    for _, row in summary.iterrows():
        log.info("%s: ratio %.3f [%.3f, %.3f] at |w| = %g", row["run"], row["ratio_median"],
                 row["ratio_min"], row["ratio_max"], row["weight"])  # fmt: skip
    write_csv(steps, snakemake.output.steps)
    write_csv(summary, snakemake.output.summary)
