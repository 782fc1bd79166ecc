#include "vm-c.h"
#include "hostd-a.h"
