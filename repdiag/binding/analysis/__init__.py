"""The binding analysis across models: the models table (aggregate, with JER by depth), the
statistics over it, the paper comparison (claims) and the markdown digest."""
