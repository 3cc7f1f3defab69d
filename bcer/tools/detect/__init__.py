"""Detection tools (``detect.*``): ``prostate_lesions`` finds lesions on the ADC grid and measures
them on the T2w grid, with its parameters (``params``), the zone reference levels (``reference``),
the T2w outline (``outline``) and the periprostatic rules of what is not a lesion
(``periprostatic``)."""
