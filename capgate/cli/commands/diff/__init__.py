"""``capgate diff BASE [HEAD]``: which decisions a policy or catalogue change flips.

    capgate diff BASE [HEAD] --catalogue PATH [--policies PATH] [--repo DIR]
                 [--limit N] [--seed S] [--call-limit N] [--show N]
                 [--markdown | --json] [--html FILE] [--no-reasons] [--no-calls]
                 [--fail-on-widen]
                 [--timeout SECONDS]

A reviewer of a policy pull request asks first what the change does to the whole
catalogue, not to the one example in its tests. This command answers by asking both
revisions the same questions. One module a step, each importing only modules listed
before it:

- ``matrix``: the compose questions, every role x task type x environment x budget
  class x connection state of both catalogues, sampled past ``--limit``;
- ``queries``: the Rego the diff asks, and the entrypoints a revision's reasons may
  come from;
- ``sides``: a revision (or the working tree) extracted with ``git archive``, its
  catalogue loaded and its bundle written;
- ``calls``: the execute questions, a complete call of each tool both sides show and
  that call with one thing wrong;
- ``evaluate``: one side's questions put to ``opa eval`` in batches, each within a bound;
- ``fixtures``: the catalogues' own representative calls (``fixtures.yaml``), asked of
  both sides;
- ``compare``: the decisions that flip between the two sides;
- ``report``: the flips as text, Markdown or JSON;
- ``grid``: the role x tool grids of a report, per scenario group and overall;
- ``page``: the grids as a self-contained HTML page (``--html FILE``);
- ``command``: the command line (``register``, ``run``) and its exit codes.

Nothing of a decision is computed here: OPA decides, on each revision's own bundle.
"""
