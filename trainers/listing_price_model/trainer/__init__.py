"""Reference regression trainer: an xgboost regressor (the listing price model)."""
