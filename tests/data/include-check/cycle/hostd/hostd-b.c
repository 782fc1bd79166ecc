#include "hostd-b-private.h"
#include "hostd-c.h"
