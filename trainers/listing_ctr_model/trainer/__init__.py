"""Reference trainer: an xgboost binary classifier for listing click-through."""
