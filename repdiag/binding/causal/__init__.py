"""The JER intervention (``snakemake binding_causal``, docs/binding.md): arms trained with a push
on the objective's gradient, compared with their plain runs by intention to treat.

:mod:`.options` resolves the arms from the config (the series named in ``binding_causal.series``)
and checks them; :mod:`.analysis` computes the contrasts, the displacement and the associations;
:mod:`.effects` reads a finished run's files into those tables; :mod:`.report` writes the
summary and the figure."""
