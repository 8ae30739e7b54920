	/bin/true28"
PATH/bin*/data/../etc