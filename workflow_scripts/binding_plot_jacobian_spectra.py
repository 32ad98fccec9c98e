"""Rule plot_jacobian_spectra: normalised singular value spectra at each model's final layer."""

from repdiag.core.runtime import exit_job, script_logging

with script_logging(snakemake.log[0], snakemake.threads) as log:
    from repdiag.binding.plots import spectra_figure
    from repdiag.common.figures import save_figure
    from repdiag.common.tables import read_table

    spectra = read_table(snakemake.input.spectra)
    save_figure(spectra_figure(spectra), snakemake.output.png, snakemake.output.pdf)
    log.info("wrote %s and %s (%d models)", *snakemake.output, spectra["model"].nunique())
exit_job()
