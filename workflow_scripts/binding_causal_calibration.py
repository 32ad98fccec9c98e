"""Rule causal_calibration: the recorded pilot of the JER regulariser's strength per base."""

from repdiag.core.runtime import exit_job, script_logging

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
        log.info("%s %s: share of the step per unit weight %.4g (p10-p90 %.4g-%.4g); weight %.3g "
                 "for %.2f", row["run"], row["term"], row["share_per_unit_weight_median"],
                 row["share_per_unit_weight_p10"], row["share_per_unit_weight_p90"],
                 row["weight_for_target"], row["target"])  # fmt: skip
    write_csv(steps, snakemake.output.steps)
    write_csv(summary, snakemake.output.summary)
exit_job()
