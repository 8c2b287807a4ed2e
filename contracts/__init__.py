"""Rules the control plane (jobs/) and the data plane (worker/) must agree on, in one torch-free place.

A job is refused at submit by the same code that would refuse it on a worker, so a user learns of a
bad model, constraint or sampling field before anything is written. Both planes import this
package; it imports neither of them, nor kernels/ or torch (tests/jobs/test_import_graph.py):

    checkpoint/        what a model folder's config.json and pooling files must say
    constraint         Constraint: the structured-output rule one request's text follows
    grammar            the llguidance grammar text of each Constraint kind
    json_text          a row's value that may come as JSON text, parsed with the field named
    lora/              what a LoRA adapter folder must say to be served over a base model
    quantization       on-the-fly quantization: the int4 group sizes, --quant-group's rule
    row_constraint     a row's Constraint from its body fields or Parquet columns
    sampling           SamplingParams: a request's sampling, each field's rule declared once
"""
