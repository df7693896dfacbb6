"""The reports: render results files (the suite's report, RESULTS.md, the READMEs' marked sections,
plots). They read results documents only, never a scenario or a contender; they import the harness."""
