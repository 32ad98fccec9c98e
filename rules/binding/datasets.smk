# The attribute-binding benchmark: query/candidate sets and Same/Different pairs rendered from
# config["datasets"]["binding"] (repdiag.binding.dataset), plus a contact sheet to look at.


rule render_binding:
    output:
        store=directory("results/datasets/binding.zarr"),
        sheet=report("results/datasets/binding_contact_sheet.png", category="Dataset"),
    log:
        log_file("render_binding", "binding"),
    benchmark:
        bench_file("render_binding", "binding")
    priority: priority_of("binding")
    conda:
        "../../envs/analysis.yaml"
    params:
        binding=config["datasets"]["binding"],
    script:
        "../../workflow_scripts/binding_render.py"
