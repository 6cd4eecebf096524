"""A discrete-event simulator of a consumer application, for comparing autoscaling policies. Pure."""
